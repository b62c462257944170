# Generated from notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable

import torch

from rosellm_edu.kernels import cpu_paged_attention
from rosellm_edu.layers.attention import grouped_attention


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


# notebooks/04_paged_attention.ipynb, cell 52
def gathered_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """The decode kernels' contract, q (seqs, heads, d) one query each, computed by the gathered reference."""
    assert scale == q.shape[-1] ** -0.5, "the reference uses attention's default scale"
    return gathered_attention(q[:, None], k_cache, v_cache, block_tables, context_lens,
                              torch.ones_like(context_lens))[:, 0]


# notebooks/04_paged_attention.ipynb, cell 52
def decode_kernel(device: torch.device) -> Callable:
    """The kernel that reads K/V blocks in place on this device; the gathered reference where none can be built."""
    if device.type == "cuda":
        from rosellm_edu.kernels.triton_paged_attention import paged_decode_attention
        return paged_decode_attention
    if device.type == "cpu" and cpu_paged_attention.extension() is not None:
        return cpu_paged_attention.paged_decode_attention_cpu
    return gathered_decode_attention


# notebooks/04_paged_attention.ipynb, cell 53
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

    @classmethod
    def build(cls, k_pool, v_pool, block_size: int, block_tables: list[list[int]], num_computed: list[int],
              num_new: list[int]) -> "PagedAttention":
        device = k_pool.device
        starts = list(accumulate(num_new, initial=0))[:-1]
        ends = [c + n for c, n in zip(num_computed, num_new)]
        slots = torch.tensor(slot_mapping(block_tables, num_computed, ends, block_size), device=device)

        def group(rows: list[int]) -> SeqGroup | None:
            pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
            return seq_group(pick(block_tables), pick(num_computed), pick(num_new), pick(starts), device) if rows else None

        decoding = [i for i, n in enumerate(num_new) if n == 1]
        prefilling = [i for i, n in enumerate(num_new) if n > 1]
        return cls(k_pool, v_pool, block_size, slots, group(decoding), group(prefilling), decode_kernel(device))

    # notebooks/04_paged_attention.ipynb, cell 54
    def attend(self, layer_idx: int, q, k, v):
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool.index_copy_(0, self.slot_mapping, k)
        v_pool.index_copy_(0, self.slot_mapping, v)
        k_blocks = k_pool.view(-1, self.block_size, *k_pool.shape[1:])     # (num_blocks, block_size, kv_heads, d)
        v_blocks = v_pool.view(-1, self.block_size, *v_pool.shape[1:])
        if self.prefill is None:   # every sequence decodes, one token each in stream order: no gather, no scatter
            d = self.decode
            return self.kernel(q, k_blocks, v_blocks, d.block_tables, d.context_lens, q.shape[-1] ** -0.5)
        out = torch.empty_like(q)                                          # (tokens, heads, d)
        if self.decode is not None:
            d = self.decode
            rows = d.query_index[:, 0]
            out[rows] = self.kernel(q[rows], k_blocks, v_blocks, d.block_tables, d.context_lens, q.shape[-1] ** -0.5)
        if self.prefill is not None:
            p = self.prefill
            attended = gathered_attention(q[p.query_index], k_blocks, v_blocks, p.block_tables, p.context_lens,
                                          p.query_lens)                   # (seqs, max_new, heads, d)
            out[p.query_index[p.query_valid]] = attended[p.query_valid]
        return out
