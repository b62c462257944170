# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from dataclasses import dataclass

import torch

from rosellm_edu.layers.attention import grouped_attention


DECODE_BUCKET = 16


@dataclass
class RowGroup:
    """Sequences attended together: their queries' rows in the stream, block tables and masks."""
    query_index: torch.Tensor   # (seqs, max_new) stream rows of each sequence's new tokens, padded with 0
    query_valid: torch.Tensor   # (seqs, max_new)
    block_tables: torch.Tensor  # (seqs, max_blocks) padded with block 0
    context_lens: torch.Tensor  # (seqs,)
    visible: torch.Tensor       # (seqs, max_new, max_blocks * block_size)


@dataclass
class PagedAttention:
    k_pool: torch.Tensor        # (layers, num_blocks * block_size, kv_heads, head_dim)
    v_pool: torch.Tensor
    block_size: int
    slot_mapping: torch.Tensor  # (tokens,) where each new token's K/V goes
    groups: list[RowGroup]      # decoding sequences (one query each) and prefilling ones, apart

    @classmethod
    def build(cls, k_pool, v_pool, block_size: int, block_tables: list[list[int]], num_cached: list[int],
              num_new: list[int]) -> "PagedAttention":
        device = k_pool.device
        starts = [sum(num_new[:i]) for i in range(len(num_new))]
        slots = [table[p // block_size] * block_size + p % block_size
                 for table, c, n in zip(block_tables, num_cached, num_new) for p in range(c, c + n)]
        # Decoding rows sorted by length and bucketed, so that little of what is gathered is padding.
        decode = sorted((i for i, n in enumerate(num_new) if n == 1), key=lambda i: len(block_tables[i]))
        buckets = [decode[j:j + DECODE_BUCKET] for j in range(0, len(decode), DECODE_BUCKET)]
        prefill = [i for i, n in enumerate(num_new) if n > 1]
        groups = [cls.group([block_tables[i] for i in rows], [num_cached[i] for i in rows],
                            [num_new[i] for i in rows], [starts[i] for i in rows], block_size, device)
                  for rows in (*buckets, prefill) if rows]
        return cls(k_pool, v_pool, block_size, torch.tensor(slots, device=device), groups)

    @staticmethod
    def group(tables, cached, new, starts, block_size, device) -> RowGroup:
        max_blocks, max_new = max(map(len, tables)), max(new)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        padded = as_tensor([t + [0] * (max_blocks - len(t)) for t in tables])
        cached_t, new_t = as_tensor(cached), as_tensor(new)
        row = torch.arange(max_new, device=device)
        valid = row < new_t[:, None]
        query_index = torch.where(valid, as_tensor(starts)[:, None] + row, 0)
        query_pos = cached_t[:, None] + row            # padding rows see the whole context; they are dropped
        key_pos = torch.arange(max_blocks * block_size, device=device)
        visible = (key_pos <= query_pos[:, :, None]) & (key_pos < (cached_t + new_t)[:, None, None])
        return RowGroup(query_index, valid, padded, cached_t + new_t, visible)

    def attend(self, layer_idx: int, q, k, v):
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool.index_copy_(0, self.slot_mapping, k)
        v_pool.index_copy_(0, self.slot_mapping, v)
        out = torch.empty_like(q)
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
