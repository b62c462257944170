# Generated from notebooks/05_cuda_graphs.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from rosellm_edu.engine.kv_pool import KVPool
from rosellm_edu.engine.paged_attention import decode_kernel
from rosellm_edu.engine.scheduler import ScheduledSeq


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, then every multiple of 8 below max_num_seqs, then max_num_seqs."""
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive integer, got {max_num_seqs!r}")
    return [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs, 8)) + [max_num_seqs]


class KVPoolWithScratch(KVPool):
    """Chapter 03's pool plus one block that no allocator hands out: padded rows write their K/V there."""

    def __init__(self, config, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        super().__init__(config, num_blocks + 1, block_size, dtype, device)
        self.num_blocks = num_blocks          # the allocator hands out blocks 0 .. num_blocks - 1
        self.scratch_block = num_blocks


def gathered_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """The decode kernels' contract in plain PyTorch, for a CPU without a C++ compiler: gather each row's blocks,
    attend to its first context_lens[i] slots. block_tables (rows, width) int32, no wider than the batch needs."""
    rows, width = block_tables.shape
    _, block_size, kv_heads, head_dim = k_cache.shape
    gather = lambda cache: cache.index_select(0, block_tables.flatten()).view(  # noqa: E731
        rows, width * block_size, kv_heads, head_dim).transpose(1, 2)            # (rows, kv_heads, slots, d)
    visible = torch.arange(width * block_size, device=q.device) < context_lens[:, None]
    out = F.scaled_dot_product_attention(q[:, :, None], gather(k_cache), gather(v_cache), visible[:, None, None],
                                         scale=scale, enable_gqa=True)           # (rows, heads, 1, d)
    return out[:, :, 0]


@dataclass
class DecodeAttention:
    """One query per row, attended by a paged-decode kernel straight from the pool. Every tensor is a view of
    the runner's static buffers, so a captured graph reads whatever the next step writes there."""
    k_pool: torch.Tensor          # (layers, slots, kv_heads, head_dim)
    v_pool: torch.Tensor
    block_size: int
    slot_mapping: torch.Tensor    # (rows,) where each row's new K/V goes
    block_tables: torch.Tensor    # (rows, width) int32
    context_lens: torch.Tensor    # (rows,) int32, each >= 1
    kernel: Callable              # (q, k_cache, v_cache, block_tables, context_lens, scale) -> (rows, heads, d)

    def attend(self, layer_idx: int, q, k, v):
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool.index_copy_(0, self.slot_mapping, k)
        v_pool.index_copy_(0, self.slot_mapping, v)
        blocks = (-1, self.block_size, *k_pool.shape[1:])       # (num_blocks, block_size, kv_heads, head_dim)
        return self.kernel(q, k_pool.view(blocks), v_pool.view(blocks), self.block_tables, self.context_lens,
                           q.shape[-1] ** -0.5)


class ModelRunner:
    """Runs the decode step of an engine through static buffers: replayed as CUDA graphs on a GPU, eagerly
    otherwise. Prefill and mixed steps are not its job: the engine runs those eagerly (`can_run` says which).

    An engine delegates to it like this, and gets the logits its own `forward(batch)` would return:

        def forward(self, batch):
            if self.runner.can_run(batch):
                return self.runner.execute(batch, self.scheduler.allocator.block_tables)
            return super().forward(batch)
    """

    def __init__(self, model, pool: KVPoolWithScratch, max_num_seqs: int, max_model_len: int, *,
                 enforce_eager: bool = False):
        if not isinstance(pool, KVPoolWithScratch):
            raise TypeError("ModelRunner needs a KVPoolWithScratch: padded rows write their K/V into its scratch block")
        self.model, self.pool = model, pool
        self.buckets = batch_size_buckets(max_num_seqs)
        self.max_num_seqs = max_num_seqs
        device, bs = pool.k.device, pool.block_size
        max_blocks = min(-(-max_model_len // bs), pool.num_blocks)
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(max_num_seqs, **long)
        self.positions = torch.zeros(max_num_seqs, **long)
        self.slot_mapping = torch.zeros(max_num_seqs, **long)
        self.block_tables = torch.zeros(max_num_seqs, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(max_num_seqs, dtype=torch.int32, device=device)
        self.logits = torch.zeros(max_num_seqs, model.config.vocab_size, dtype=pool.k.dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if device.type == "cuda" and not enforce_eager:
            self.capture()

    def can_run(self, batch: list[ScheduledSeq]) -> bool:
        """A decode batch: every row computes one token and samples from it."""
        return 0 < len(batch) <= self.max_num_seqs and all(s.num_new == 1 and s.samples for s in batch)

    def padded_size(self, num_seqs: int) -> int:
        """The smallest bucket that holds num_seqs rows."""
        return self.buckets[bisect_left(self.buckets, num_seqs)]

    @torch.no_grad()
    def execute(self, batch: list[ScheduledSeq], block_tables: dict[str, list[int]]) -> torch.Tensor:
        """Logits (rows, vocab) of a decode batch, in batch order: what the engine's eager forward returns."""
        if not self.can_run(batch):
            raise ValueError(f"ModelRunner runs decode batches of 1 to {self.max_num_seqs} sequences, one new "
                             "token each; run prefill and mixed batches through the engine's eager forward")
        n = len(batch)
        rows = self.padded_size(n) if self.graphs else n     # no graph to fit: CPU pays for no padding
        width = self.prepare_decode(batch, [block_tables[s.seq.request_id] for s in batch], rows)
        if not self.graphs:
            return self.run_decode(rows, width)
        self.graphs[rows].replay()
        return self.logits[:n].clone()                        # the buffer is overwritten by the next step

    def prepare_decode(self, batch: list[ScheduledSeq], tables: list[list[int]], rows: int) -> int:
        """Write the batch into the first `rows` rows of the static buffers, padding rows after it; returns the
        block-table width the batch uses. A padded row is token 0 at position 0, whose K/V go to the scratch
        slot and whose context is that one slot: harmless, and finite."""
        bs, scratch, pad = self.pool.block_size, self.pool.scratch_block, rows - len(batch)
        positions = [s.num_cached for s in batch]
        width = max(map(len, tables), default=1)
        as_cpu = lambda x, dtype=torch.long: torch.tensor(x, dtype=dtype)  # noqa: E731
        self.input_ids[:rows].copy_(as_cpu([s.seq.token_at(p) for s, p in zip(batch, positions)] + [0] * pad))
        self.positions[:rows].copy_(as_cpu(positions + [0] * pad))
        self.slot_mapping[:rows].copy_(as_cpu([t[p // bs] * bs + p % bs for t, p in zip(tables, positions)]
                                              + [scratch * bs] * pad))
        self.context_lens[:rows].copy_(as_cpu([p + 1 for p in positions] + [1] * pad, torch.int32))
        self.block_tables[:rows, :width].copy_(as_cpu([t + [scratch] * (width - len(t)) for t in tables]
                                                      + [[scratch] * width] * pad, torch.int32))
        return width

    def run_decode(self, rows: int, width: int) -> torch.Tensor:
        """The model over the first `rows` rows of the buffers; logits (rows, vocab)."""
        hidden = self.model(self.input_ids[:rows], self.positions[:rows], self.decode_attention(rows, width))
        return self.model.compute_logits(hidden)

    def decode_attention(self, rows: int, width: int) -> DecodeAttention:
        kernel, tables = decode_kernel(self.pool.k.device), self.block_tables[:rows]  # chapter 04's kernels
        if kernel is None:           # no C++ compiler: gather instead, and no more columns than the batch uses
            kernel, tables = gathered_decode_attention, tables[:, :width]
        return DecodeAttention(self.pool.k, self.pool.v, self.pool.block_size, self.slot_mapping[:rows], tables,
                               self.context_lens[:rows], kernel)

    @torch.no_grad()
    def capture(self) -> None:
        """One CUDA graph per bucket, largest first, all allocating from one memory pool: the graphs never run
        at once, so they can share it, and the smaller ones fit in what the largest left behind."""
        self.graph_pool = torch.cuda.graph_pool_handle()
        width = self.block_tables.shape[1]
        for rows in reversed(self.buckets):
            self.prepare_decode([], [], rows)                          # every row a padded row
            self.logits[:rows] = self.run_decode(rows, width)        # warm-up: Triton compiles, cuBLAS plans
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self.logits[:rows] = self.run_decode(rows, width)
            self.graphs[rows] = graph
        torch.cuda.synchronize()
