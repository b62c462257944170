# Generated from notebooks/05_cuda_graphs.ipynb, notebooks/06a_logprobs.ipynb, notebooks/08_where_the_time_goes.ipynb, notebooks/11b_native_decode.ipynb, notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from bisect import bisect_left

import torch

from rosellm_edu.engine.block_manager import BlockTable
from rosellm_edu.engine.kv_cache import KVCache
from rosellm_edu.engine.native_decode import NativeDecode
from rosellm_edu.engine.scheduler import ScheduledSeq
from rosellm_edu.layers.logits_processors import on_device
from rosellm_edu.layers.paged_attention import PagedAttention, SeqGroup, decode_kernel, padded_tables
from rosellm_edu.timing import choose


# notebooks/05_cuda_graphs.ipynb, cell 20
def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, then every multiple of 8 below max_num_seqs, then max_num_seqs."""
    if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive integer, got {max_num_seqs!r}")
    return [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs, 8)) + [max_num_seqs]


# notebooks/05_cuda_graphs.ipynb, cell 20
def check_triton_shapes(block_size: int, head_dim: int) -> None:
    """The Triton decode kernel tiles a block and a head with tl.arange, which needs powers of two."""
    for name, value in [("block_size", block_size), ("head_dim", head_dim)]:
        if value & (value - 1):
            raise ValueError(f"the GPU decode kernel needs a power-of-two {name}, got {value}")


# notebooks/05_cuda_graphs.ipynb, cell 22
class ModelRunner:
    """Runs the model over a scheduled batch and returns the logits of the rows that sample. Prefill and mixed
    batches run eagerly; decode batches run through static buffers, replayed as CUDA graphs on a GPU."""

    # notebooks/08_where_the_time_goes.ipynb, cell 45
    def __init__(self, model, kv_cache: KVCache, max_num_seqs: int, max_model_len: int, *, enforce_eager: bool = False):
        self.model, self.kv_cache = model, kv_cache
        self.buckets = batch_size_buckets(max_num_seqs)
        self.max_num_seqs = max_num_seqs
        device, bs = kv_cache.k.device, kv_cache.block_size
        if device.type == "cuda":
            check_triton_shapes(bs, kv_cache.k.shape[-1])
        max_blocks = min(-(-max_model_len // bs), kv_cache.num_blocks)
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(max_num_seqs, **long)
        self.positions = torch.zeros(max_num_seqs, **long)
        self.slot_mapping = torch.zeros(max_num_seqs, **long)
        self.rows = torch.arange(max_num_seqs, **long)[:, None]      # decode row i is stream row i
        self.block_tables = torch.zeros(max_num_seqs, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(max_num_seqs, dtype=torch.int32, device=device)
        self.logits = torch.zeros(max_num_seqs, model.config.vocab_size, dtype=kv_cache.k.dtype, device=device)
        # where a step's inputs are written on the host. On a GPU, pinned (page-locked) CPU memory, from which a
        # non_blocking copy returns at once; on a CPU the buffers themselves, so nothing is copied twice.
        names = ["input_ids", "positions", "slot_mapping", "context_lens", "block_tables"]
        self.staging = {name: getattr(self, name) if device.type == "cpu" else
                        torch.empty_like(getattr(self, name), device="cpu").pin_memory() for name in names}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if device.type == "cuda" and not enforce_eager:
            self.capture()

    # notebooks/12_speculative_decoding.ipynb, cell 31
    @torch.no_grad()
    def run(self, batch: list[ScheduledSeq], block_tables: BlockTable | dict[str, list[int]]) -> torch.Tensor:
        """Logits (sampled positions, vocab), in batch order. A row of several positions decodes as that many
        rows of one position each; those from the sequence's last token on are sampled."""
        tables = table_rows(block_tables, batch, self.kv_cache.block_size)                 # (seqs, width)
        if not self.is_decode(batch):
            return self.run_eager(batch, tables)
        n = sum(s.num_new for s in batch)                                                  # decode rows
        wide = n > len(batch)          # a row of several positions; a plain decode step copies nothing
        if wide:
            tables = tables.repeat_interleave(torch.tensor([s.num_new for s in batch]), dim=0)   # (n, width)
            batch = [ScheduledSeq(s.seq, p, 1, s.draft_token_ids) for s in batch for p in range(s.num_computed, s.end)]
        rows = self.padded_size(n) if self.graphs else n     # no graph to fit: the CPU pays for no padding
        width = self.prepare_decode(batch, tables, rows)
        if self.graphs:
            self.graphs[rows].replay()
            logits = self.logits[:n].clone()                  # the buffer is overwritten by the next step
        else:
            logits = self.run_decode(rows, width)
        if not wide:
            return logits
        sampled = [i for i, s in enumerate(batch) if s.num_computed >= len(s.seq) - 1]   # not a catch-up's first
        return logits if len(sampled) == n else logits[sampled]

    # notebooks/12_speculative_decoding.ipynb, cell 29
    def run_eager(self, batch: list[ScheduledSeq], tables: torch.Tensor | list[list[int]],
                  keep: list[range] | None = None) -> torch.Tensor:
        """One forward pass over the batch's new tokens. Logits of the sampled positions (1 + drafts of a
        speculating row), in batch order, then those of the positions keep[i] of each batch[i], in order."""
        ids, positions, sampled_rows, kept_rows, start = [], [], [], [], 0
        for i, s in enumerate(batch):
            ids += s.token_ids()                                                # drafts after the tokens
            positions += range(s.num_computed, s.end)
            if keep:
                kept_rows += [start + p - s.num_computed for p in keep[i]]
            sampled_rows += [start + p - s.num_computed for p in s.logit_positions]
            start += s.num_new
        kv = self.kv_cache
        ctx = PagedAttention.build(kv.k, kv.v, kv.block_size, tables, [s.num_computed for s in batch],
                                   [s.num_new for s in batch])
        device = kv.k.device
        hidden = self.model(on_device(ids, torch.long, device), on_device(positions, torch.long, device), ctx)
        picked = on_device(sampled_rows + kept_rows, torch.long, device)                    # may be none
        return self.model.compute_logits(hidden.index_select(0, picked))

    # notebooks/12_speculative_decoding.ipynb, cell 29
    def is_decode(self, batch: list[ScheduledSeq]) -> bool:
        """Every row samples and computes at most decode_query_len positions, each a decode row (a token and its
        drafts), max_num_seqs rows in all."""
        return 0 < sum(s.num_new for s in batch) <= self.max_num_seqs and all(
            s.samples and s.num_new <= self.decode_query_len for s in batch)

    # notebooks/05_cuda_graphs.ipynb, cell 26
    def padded_size(self, num_seqs: int) -> int:
        """The smallest bucket that holds num_seqs rows."""
        return self.buckets[bisect_left(self.buckets, num_seqs)]

    # notebooks/12_speculative_decoding.ipynb, cell 32
    def prepare_decode(self, batch: list[ScheduledSeq], tables: torch.Tensor | list[list[int]], rows: int) -> int:
        """Write the batch into the first `rows` rows of the static buffers, padding rows after it; returns the
        block-table width the batch uses. A padded row is token 0 at position 0, whose K/V go to the scratch
        slot and whose context is that one slot: harmless, and finite. Tables is (len(batch), width) int32."""
        bs, scratch, n = self.kv_cache.block_size, self.kv_cache.scratch_block, len(batch)
        tables = tables if isinstance(tables, torch.Tensor) else padded_tables(tables)     # lists: padded once
        width = tables.shape[1]
        stage = self.staging
        positions = torch.tensor([s.num_computed for s in batch], dtype=torch.long)        # (n,)
        stage["input_ids"][:n] = torch.tensor([s.token_ids()[0] for s in batch], dtype=torch.long)   # or a draft
        stage["positions"][:n] = positions
        stage["slot_mapping"][:n] = tables[torch.arange(n), positions // bs].long() * bs + positions % bs
        stage["context_lens"][:n] = positions + 1
        stage["block_tables"][:n, :width] = tables
        for name, pad in [("input_ids", 0), ("positions", 0), ("slot_mapping", scratch * bs), ("context_lens", 1)]:
            stage[name][n:rows] = pad
        stage["block_tables"][n:rows, :width] = scratch
        for name in ["input_ids", "positions", "slot_mapping", "context_lens"]:
            if stage[name] is not getattr(self, name):   # a GPU: the copy is queued; the next step's sync ends it
                getattr(self, name)[:rows].copy_(stage[name][:rows], non_blocking=True)
        if stage["block_tables"] is not self.block_tables:
            self.block_tables[:rows, :width].copy_(stage["block_tables"][:rows, :width], non_blocking=True)
        return width

    # notebooks/11b_native_decode.ipynb, cell 48
    def run_decode(self, rows: int, width: int) -> torch.Tensor:
        """The model over the first `rows` rows of the buffers; logits (rows, vocab). On a CPU, through
        native_decode's choice."""
        ids, positions, ctx = self.input_ids[:rows], self.positions[:rows], self.decode_attention(rows, width)
        forward = self.native_decode(ids, positions, ctx) or self.model
        return self.model.compute_logits(forward(ids, positions, ctx))

    # notebooks/05_cuda_graphs.ipynb, cell 30
    def decode_attention(self, rows: int, width: int) -> PagedAttention:
        """Attention metadata made of views of the static buffers, so a captured graph reads what the next step
        writes there. A graph is captured with every block-table column; an eager step passes only the `width`
        columns its batch uses."""
        kv = self.kv_cache
        group = SeqGroup(self.rows[:rows], None, self.block_tables[:rows, :width], self.context_lens[:rows], None)
        return PagedAttention(kv.k, kv.v, kv.block_size, self.slot_mapping[:rows], group, None,
                              decode_kernel(kv.k.device))

    # notebooks/05_cuda_graphs.ipynb, cell 32
    @torch.no_grad()
    def capture(self) -> None:
        """One CUDA graph per bucket, largest first, all allocating from one memory pool: the graphs never run
        at once, so they can share it, and the smaller ones fit in what the largest left behind."""
        width = self.block_tables.shape[1]
        with torch.cuda.device(self.kv_cache.k.device):     # the cache's GPU, which need not be the current one
            self.graph_pool = torch.cuda.graph_pool_handle()
            for rows in reversed(self.buckets):
                self.prepare_decode([], [], rows)                      # every row a padded row
                self.logits[:rows] = self.run_decode(rows, width)    # warm-up: Triton compiles, cuBLAS plans
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.graph_pool):
                    self.logits[:rows] = self.run_decode(rows, width)
                self.graphs[rows] = graph
            torch.cuda.synchronize()

    # notebooks/11b_native_decode.ipynb, cell 48
    def native_decode(self, ids: torch.Tensor, positions: torch.Tensor, ctx: PagedAttention) -> NativeDecode | None:
        """The NativeDecode a decode step of len(ids) rows runs through: where one can run it and it measured
        faster than the model's modules at the first such step, one region a step or a region per kernel, whichever
        measured faster; else None (the modules)."""
        if not hasattr(self, "native_plan"):                              # the model is loaded: built once
            self.native_plan = NativeDecode.build(self.model, self.kv_cache)
        plan = self.native_plan
        if plan is None or len(ids) > plan.max_rows:
            return None
        ways = {"modules": lambda: self.model(ids, positions, ctx),
                "native": lambda: plan(ids, positions, ctx, one_region=False),
                "native, one region": lambda: plan(ids, positions, ctx, one_region=True)}
        choice = choose(plan.key, ways)
        plan.one_region = choice.name == "native, one region"
        return None if choice.name == "modules" else plan


# notebooks/08_where_the_time_goes.ipynb, cell 43
def table_rows(block_tables: BlockTable | dict[str, list[int]], batch: list[ScheduledSeq], block_size: int) -> torch.Tensor:
    """(seqs, width) int32 block ids of the batch, width the most blocks any of them uses this step: gathered from
    a BlockTable's rows, or (as before chapter 08) padded from lists."""
    width = max((-(-(s.num_computed + s.num_new) // block_size) for s in batch), default=1)
    ids = [s.seq.request_id for s in batch]
    if isinstance(block_tables, BlockTable):
        return block_tables.rows(ids, width)
    return padded_tables([block_tables[r][:width] for r in ids])


# notebooks/12_speculative_decoding.ipynb, cell 29
ModelRunner.decode_query_len = 1   # 1 + k in a speculating engine's runner
