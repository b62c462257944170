# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from dataclasses import dataclass
from typing import Callable

import torch

from rosellm_edu.engine import cpu_paged_attention
from rosellm_edu.layers.attention import grouped_attention

DECODE_BUCKET = 16


def decode_kernel(device: torch.device) -> Callable | None:
    """The kernel that reads K/V blocks in place on this device, or None: then the blocks are gathered."""
    if device.type == "cuda":
        from rosellm_edu.engine.triton_paged_attention import paged_decode_attention
        return paged_decode_attention
    if device.type == "cpu" and cpu_paged_attention.extension() is not None:
        return cpu_paged_attention.paged_decode_attention_cpu
    return None


@dataclass
class DecodeRows:
    """Sequences with one new token each, attended by a kernel straight from the pool."""
    rows: torch.Tensor          # (seqs,) their queries' rows in the stream
    block_tables: torch.Tensor  # (seqs, max_blocks) int32, padded with block 0
    context_lens: torch.Tensor  # (seqs,) int32
    kernel: Callable


@dataclass
class RowGroup:
    """Sequences attended together by gathering: their queries' rows in the stream, block tables and masks."""
    query_index: torch.Tensor   # (seqs, max_new) stream rows of each sequence's new tokens, padded with 0
    query_valid: torch.Tensor   # (seqs, max_new)
    block_tables: torch.Tensor  # (seqs, max_blocks) padded with block 0
    visible: torch.Tensor       # (seqs, max_new, max_blocks * block_size)


def padded_tables(tables: list[list[int]], dtype, device) -> torch.Tensor:
    width = max(map(len, tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=dtype, device=device)


@dataclass
class PagedAttention:
    k_pool: torch.Tensor        # (layers, num_blocks * block_size, kv_heads, head_dim)
    v_pool: torch.Tensor
    block_size: int
    slot_mapping: torch.Tensor  # (tokens,) where each new token's K/V goes
    decode: DecodeRows | None   # decoding sequences, when a kernel can read the pool in place
    groups: list[RowGroup]      # the sequences whose K/V are gathered: prefills, and decodes without a kernel

    @classmethod
    def build(cls, k_pool, v_pool, block_size: int, block_tables: list[list[int]], num_cached: list[int],
              num_new: list[int], use_kernel: bool = True) -> "PagedAttention":
        device = k_pool.device
        starts = [sum(num_new[:i]) for i in range(len(num_new))]
        slots = [table[p // block_size] * block_size + p % block_size
                 for table, c, n in zip(block_tables, num_cached, num_new) for p in range(c, c + n)]
        decoding = [i for i, n in enumerate(num_new) if n == 1]
        prefill = [i for i, n in enumerate(num_new) if n > 1]
        kernel = decode_kernel(device) if use_kernel else None
        decode, buckets = None, []
        if kernel is not None and decoding:
            decode = DecodeRows(torch.tensor([starts[i] for i in decoding], device=device),
                                padded_tables([block_tables[i] for i in decoding], torch.int32, device),
                                torch.tensor([num_cached[i] + 1 for i in decoding], dtype=torch.int32, device=device),
                                kernel)
        else:  # sorted by length and bucketed, so that little of what is gathered is padding
            decoding.sort(key=lambda i: len(block_tables[i]))
            buckets = [decoding[j:j + DECODE_BUCKET] for j in range(0, len(decoding), DECODE_BUCKET)]
        groups = [cls.group([block_tables[i] for i in rows], [num_cached[i] for i in rows],
                            [num_new[i] for i in rows], [starts[i] for i in rows], block_size, device)
                  for rows in (*buckets, prefill) if rows]
        return cls(k_pool, v_pool, block_size, torch.tensor(slots, device=device), decode, groups)

    @staticmethod
    def group(tables, cached, new, starts, block_size, device) -> RowGroup:
        max_new = max(new)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        padded = padded_tables(tables, torch.long, device)
        cached_t, new_t = as_tensor(cached), as_tensor(new)
        row = torch.arange(max_new, device=device)
        valid = row < new_t[:, None]
        query_index = torch.where(valid, as_tensor(starts)[:, None] + row, 0)
        query_pos = cached_t[:, None] + row            # padding rows see the whole context; they are dropped
        key_pos = torch.arange(padded.shape[1] * block_size, device=device)
        visible = (key_pos <= query_pos[:, :, None]) & (key_pos < (cached_t + new_t)[:, None, None])
        return RowGroup(query_index, valid, padded, visible)

    def attend(self, layer_idx: int, q, k, v):
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool.index_copy_(0, self.slot_mapping, k)
        v_pool.index_copy_(0, self.slot_mapping, v)
        out = torch.empty_like(q)
        if self.decode is not None:
            d, blocks = self.decode, (-1, self.block_size, *k_pool.shape[1:])
            out[d.rows] = d.kernel(q[d.rows], k_pool.view(blocks), v_pool.view(blocks), d.block_tables,
                                   d.context_lens, q.shape[-1] ** -0.5)
        for g in self.groups:
            out[g.query_index[g.query_valid]] = self.attend_group(g, k_pool, v_pool, q)
        return out

    def attend_group(self, g: RowGroup, k_pool, v_pool, q):
        # index_select of whole blocks is a plain row copy, several times faster than advanced indexing.
        seqs, max_blocks = g.block_tables.shape
        shape = (seqs, max_blocks * self.block_size, *k_pool.shape[1:])
        blocks = g.block_tables.flatten()
        keys = k_pool.view(-1, self.block_size * k_pool[0].numel()).index_select(0, blocks).view(shape)
        values = v_pool.view(-1, self.block_size * v_pool[0].numel()).index_select(0, blocks).view(shape)
        out = grouped_attention(q[g.query_index], keys, values, g.visible)    # (seqs, max_new, heads, d)
        return out[g.query_valid]
