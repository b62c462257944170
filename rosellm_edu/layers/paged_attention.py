# Generated from notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/08_where_the_time_goes.ipynb, notebooks/09_attention_kernels.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass
from typing import Callable

import torch

from rosellm_edu.kernels import cpu_attention, cpu_paged_attention
from rosellm_edu.layers.attention import grouped_attention
from rosellm_edu.layers.logits_processors import on_device
from rosellm_edu.timing import CHOICES, Choice, choose


# notebooks/03_continuous_batching.ipynb, cell 14
def slot_mapping(block_tables: list[list[int]], starts: list[int], ends: list[int], block_size: int) -> list[int]:
    """The pool slots of positions starts[i] .. ends[i] - 1 of every sequence i, one sequence after another."""
    return [table[p // block_size] * block_size + p % block_size
            for table, start, end in zip(block_tables, starts, ends) for p in range(start, end)]


# notebooks/03_continuous_batching.ipynb, cell 14
def gathered_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens) -> torch.Tensor:
    """Paged attention by gathering each sequence's blocks: the reference every kernel is checked against.
    q (seqs, max_new, heads, d): each sequence's last query_lens[i] positions, padded; k_cache, v_cache
    (num_blocks, block_size, kv_heads, d); block_tables (seqs, width); context_lens (seqs,): positions with K/V,
    the new ones included. Returns (seqs, max_new, heads, d); padding rows see the whole context."""
    seqs, width = block_tables.shape
    slots = width * k_cache.shape[1]
    blocks = block_tables.flatten().long()
    keys = k_cache.index_select(0, blocks).view(seqs, slots, *k_cache.shape[2:])    # (seqs, slots, kv_heads, d)
    values = v_cache.index_select(0, blocks).view(seqs, slots, *v_cache.shape[2:])
    query_pos = (context_lens - query_lens)[:, None] + torch.arange(q.shape[1], device=q.device)  # (seqs, max_new)
    key_pos = torch.arange(slots, device=q.device)
    visible = (key_pos <= query_pos[:, :, None]) & (key_pos < context_lens[:, None, None])   # (seqs, max_new, slots)
    return grouped_attention(q, keys, values, visible)


# notebooks/03_continuous_batching.ipynb, cell 16
@dataclass
class SeqGroup:
    """Sequences attended together: where their new tokens sit in the batch's token stream, and their blocks."""
    query_index: torch.Tensor   # (seqs, max_new) stream rows of each sequence's new tokens, padded with 0
    query_valid: torch.Tensor | None   # (seqs, max_new) False on padding; None for decode (max_new = 1)
    block_tables: torch.Tensor         # (seqs, width) int32, padded with block 0
    context_lens: torch.Tensor         # (seqs,) int32: computed + new positions
    query_lens: torch.Tensor | None    # (seqs,) int32: new positions; None for decode


# notebooks/03_continuous_batching.ipynb, cell 16
def seq_group(block_tables: list[list[int]], num_computed: list[int], num_new: list[int], starts: list[int],
              device) -> SeqGroup:
    as_int = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    width, max_new = max(map(len, block_tables)), max(num_new)
    new = torch.tensor(num_new, device=device)[:, None]
    row = torch.arange(max_new, device=device)
    valid = row < new                                                      # (seqs, max_new)
    query_index = torch.where(valid, torch.tensor(starts, device=device)[:, None] + row, 0)
    tables = as_int([t + [0] * (width - len(t)) for t in block_tables])
    return SeqGroup(query_index, valid, tables, as_int([c + n for c, n in zip(num_computed, num_new)]), as_int(num_new))


# notebooks/04_paged_attention.ipynb, cell 57
def gathered_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """The decode kernels' contract, q (seqs, heads, d) one query each, computed by the gathered reference."""
    assert scale == q.shape[-1] ** -0.5, "the reference uses attention's default scale"
    return gathered_attention(q[:, None], k_cache, v_cache, block_tables, context_lens,
                              torch.ones_like(context_lens))[:, 0]


# notebooks/09_attention_kernels.ipynb, cell 57
def gathered_prefill_attention(q, k_cache, v_cache, block_tables, context_lens, cu_query_lens,
                               scale: float) -> torch.Tensor:
    """The varlen prefill contract, q (tokens, heads, d) packed by cu_query_lens, computed by the gathered
    reference: the fallback where no kernel can be built."""
    assert scale == q.shape[-1] ** -0.5, "the reference uses attention's default scale"
    query_lens = cu_query_lens.diff()
    row = torch.arange(int(query_lens.max()), device=q.device)
    valid = row < query_lens[:, None]                                      # (seqs, max_new)
    index = torch.where(valid, cu_query_lens[:-1, None] + row, 0)
    out = gathered_attention(q[index], k_cache, v_cache, block_tables, context_lens, query_lens)
    return out[valid]                                                      # (tokens, heads, d)


# notebooks/09_attention_kernels.ipynb, cell 58
PREFILL_OFFSETS = (0, 512, 1024, 2048)   # offset buckets: a batch counts as the largest its longest prefix reaches


# notebooks/09_attention_kernels.ipynb, cell 58
PREFILL_CHUNK = 128                      # queries of the chunk each bucket is measured on


# notebooks/09_attention_kernels.ipynb, cell 58
def decode_kernel(device: torch.device) -> Callable:
    """Decode attention on this device: Triton on a GPU; on a CPU chapter 09's kernel, else chapter 04's, else
    the gather."""
    if device.type == "cuda":                      # split-k Triton (chapter 09's GPU section)
        from rosellm_edu.kernels.triton_paged_prefill import paged_decode_attention_split_k
        return paged_decode_attention_split_k
    if device.type == "cpu" and cpu_attention.extension() is not None:
        return cpu_attention.paged_decode_attention_cpu
    if device.type == "cpu" and cpu_paged_attention.extension() is not None:
        return cpu_paged_attention.paged_decode_attention_cpu
    return gathered_decode_attention


# notebooks/04_paged_attention.ipynb, cell 58
@dataclass
class PagedAttention:
    """The attention context of one forward pass over a batch: each layer writes its new K/V into their slots,
    then decoding sequences are attended by the device's kernel in place, the others by gathering."""
    k_pool: torch.Tensor          # (layers, slots, kv_heads, head_dim)
    v_pool: torch.Tensor
    block_size: int
    slot_mapping: torch.Tensor    # (tokens,) where each new token's K/V goes
    decode: SeqGroup | None       # one new token each
    prefill: SeqGroup | None      # several new tokens each
    kernel: Callable              # (q, k_cache, v_cache, block_tables, context_lens, scale) -> (seqs, heads, d)

    # notebooks/08_where_the_time_goes.ipynb, cell 41
    @classmethod
    def build(cls, k_pool, v_pool, block_size: int, block_tables: list[list[int]] | torch.Tensor, num_computed: list[int],
              num_new: list[int]) -> "PagedAttention":
        """block_tables may be the (seqs, width) int32 rows a BlockTable gathered; the slots and groups are
        computed with tensor operations, not per position in Python."""
        tables = block_tables if isinstance(block_tables, torch.Tensor) else padded_tables(block_tables)
        tables = tables.cpu()
        computed, new = torch.tensor(num_computed), torch.tensor(num_new)
        starts = new.cumsum(0) - new                                                       # first stream row of each
        seq = torch.repeat_interleave(torch.arange(len(new)), new)                         # (tokens,) its sequence
        pos = computed[seq] + torch.arange(len(seq)) - starts[seq]                         # (tokens,) its position
        slots = tables[seq, pos // block_size].long() * block_size + pos % block_size
        device = k_pool.device
        groups = [group_of(rows.nonzero().flatten(), tables, computed, new, starts, block_size, device)
                  for rows in (new == 1, new > 1)]
        return cls(k_pool, v_pool, block_size, on_device(slots, None, device), *groups, decode_kernel(device))

    # notebooks/09_attention_kernels.ipynb, cell 62
    def attend(self, layer_idx: int, q, k, v):
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool.index_copy_(0, self.slot_mapping, k)
        v_pool.index_copy_(0, self.slot_mapping, v)
        k_blocks = k_pool.view(-1, self.block_size, *k_pool.shape[1:])     # (num_blocks, block_size, kv_heads, d)
        v_blocks = v_pool.view(-1, self.block_size, *v_pool.shape[1:])
        scale = q.shape[-1] ** -0.5
        if self.prefill is None:   # every sequence decodes, one token each in stream order: no gather, no scatter
            d = self.decode
            return self.kernel(q, k_blocks, v_blocks, d.block_tables, d.context_lens, scale)
        rows, cu_query_lens = self.packed_prefill(q.shape[0])              # packed prefill rows
        p, prefill = self.prefill, prefill_kernel(q.device)
        if self.decode is None:    # every sequence prefills: the stream is already packed in sequence order
            return prefill(q, k_blocks, v_blocks, p.block_tables, p.context_lens, cu_query_lens, scale)
        out = torch.empty_like(q)                                          # (tokens, heads, d)
        d = self.decode
        out[d.query_index[:, 0]] = self.kernel(q[d.query_index[:, 0]], k_blocks, v_blocks, d.block_tables,
                                               d.context_lens, scale)
        out[rows] = prefill(q[rows], k_blocks, v_blocks, p.block_tables, p.context_lens, cu_query_lens, scale)
        return out

    # notebooks/09_attention_kernels.ipynb, cell 62
    def packed_prefill(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, cu_query_lens): the prefill group's stream rows, sequence after sequence, and their offsets (seqs + 1,)
        int32; computed on the first layer's call, then kept for the step. Their count is known on the host (the
        stream's tokens less one per decoding sequence), so no boolean-mask index has to wait for the GPU to count."""
        if getattr(self, "_packed_prefill", None) is None:
            p = self.prefill
            cu_query_lens = torch.nn.functional.pad(p.query_lens.cumsum(0, dtype=torch.int32), (1, 0))
            count = num_tokens - (0 if self.decode is None else self.decode.query_index.shape[0])
            valid_first = torch.argsort((~p.query_valid).flatten().byte(), stable=True)[:count]   # valid, in order
            self._packed_prefill = (p.query_index.flatten()[valid_first], cu_query_lens)
        return self._packed_prefill


# notebooks/08_where_the_time_goes.ipynb, cell 41
def padded_tables(block_tables: list[list[int]]) -> torch.Tensor:
    """Lists of block ids as one (seqs, width) int32 tensor, padded with block 0."""
    width = max(map(len, block_tables), default=1)
    return torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32).reshape(-1, width)


# notebooks/08_where_the_time_goes.ipynb, cell 41
def group_of(rows: torch.Tensor, tables, computed, new, starts, block_size: int, device) -> SeqGroup | None:
    """The SeqGroup of the batch's sequences `rows`, from (seqs,) CPU tensors, moved to the device once."""
    if len(rows) == 0:
        return None
    n, ends = new[rows], (computed + new)[rows]
    valid = torch.arange(int(n.max()))[None, :] < n[:, None]                           # (seqs, max_new)
    query_index = torch.where(valid, starts[rows][:, None] + torch.arange(valid.shape[1]), 0)
    width = -(-int(ends.max()) // block_size)                                          # the blocks they use
    to = lambda x, dtype=None: on_device(x, dtype, device)  # noqa: E731   (pinned: no host sync on a GPU)
    return SeqGroup(to(query_index), to(valid), to(tables[rows, :width].contiguous()), to(ends, torch.int32),
                    to(n, torch.int32))


# notebooks/09_attention_kernels.ipynb, cell 58
def prefill_kernel(device: torch.device) -> Callable:
    """Varlen prefill attention on this device: Triton on a GPU; on a CPU chapter 09's kernel or the gather,
    chosen by measurement; the gather where no kernel can be built."""
    if device.type == "cuda":
        from rosellm_edu.kernels.triton_paged_prefill import paged_prefill_attention
        return paged_prefill_attention
    if device.type == "cpu" and cpu_attention.extension() is not None:
        return measured_prefill_attention
    return gathered_prefill_attention


# notebooks/09_attention_kernels.ipynb, cell 59
def measured_prefill_attention(q, k_cache, v_cache, block_tables, context_lens, cu_query_lens, scale: float):
    """The varlen prefill contract through chapter 09's kernel or the gather, whichever measured faster on this
    machine for the batch's dtype, head layout and offset bucket."""
    offset = int((context_lens - cu_query_lens.diff()).max())          # the batch's longest cached prefix
    choice = prefill_choice(q.dtype, q.shape[1], *k_cache.shape[1:], offset)
    path = cpu_attention.paged_prefill_attention_cpu if choice.name == "kernel" else gathered_prefill_attention
    return path(q, k_cache, v_cache, block_tables, context_lens, cu_query_lens, scale)


# notebooks/09_attention_kernels.ipynb, cell 59
def prefill_choice(dtype, heads: int, block_size: int, kv_heads: int, head_dim: int, offset: int) -> Choice:
    """Kernel or gather, timed once per process and bucket (timing.choose) on one chunk of PREFILL_CHUNK queries
    after the bucket's offset, random K/V in shuffled blocks."""
    bucket = max(b for b in PREFILL_OFFSETS if b <= offset)
    key = f"prefill attention, {dtype}, {heads} heads over {kv_heads}x{head_dim}, block {block_size}, offset {bucket}"
    if key in CHOICES:
        return CHOICES[key]
    g = torch.Generator().manual_seed(0)
    blocks = -(-(bucket + PREFILL_CHUNK) // block_size)
    k_cache, v_cache = torch.randn(2, blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    args = (torch.randn(PREFILL_CHUNK, heads, head_dim, generator=g).to(dtype), k_cache, v_cache,
            torch.randperm(blocks, generator=g).to(torch.int32)[None],          # (1, blocks): scattered
            torch.tensor([bucket + PREFILL_CHUNK], dtype=torch.int32),
            torch.tensor([0, PREFILL_CHUNK], dtype=torch.int32), head_dim ** -0.5)
    return choose(key, {"kernel": lambda: cpu_attention.paged_prefill_attention_cpu(*args),
                        "gather": lambda: gathered_prefill_attention(*args)})
