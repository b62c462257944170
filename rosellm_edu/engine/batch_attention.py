# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from dataclasses import dataclass

import torch

from rosellm_edu.layers.attention import grouped_attention


def token_slots(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """Pool slots of a sequence's token positions start .. end-1."""
    return [block_table[i // block_size] * block_size + i % block_size for i in range(start, end)]


@dataclass
class BatchAttention:
    k_pool: torch.Tensor        # (layers, slots, kv_heads, head_dim)
    v_pool: torch.Tensor
    slot_mapping: torch.Tensor  # (tokens,) where each new token's K/V goes
    key_slots: torch.Tensor     # (seqs, max_context) slots of every context position, padded with slot 0
    query_index: torch.Tensor   # (seqs, max_new) positions in the token stream, padded with 0
    query_valid: torch.Tensor   # (seqs, max_new) False on padding
    visible: torch.Tensor       # (seqs, max_new, max_context) causal and length mask

    @classmethod
    def build(cls, k_pool, v_pool, block_size: int, block_tables: list[list[int]], num_cached: list[int],
              num_new: list[int]) -> "BatchAttention":
        device = k_pool.device
        context = [c + n for c, n in zip(num_cached, num_new)]
        max_ctx, max_new = max(context), max(num_new)
        slot_mapping, key_slots, query_index = [], [], []
        start = 0
        for table, cached, new, ctx in zip(block_tables, num_cached, num_new, context):
            slot_mapping += token_slots(table, block_size, cached, ctx)
            key_slots.append(token_slots(table, block_size, 0, ctx) + [0] * (max_ctx - ctx))
            query_index.append(list(range(start, start + new)) + [0] * (max_new - new))
            start += new
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        new_t, cached_t, ctx_t = as_tensor(num_new), as_tensor(num_cached), as_tensor(context)
        row = torch.arange(max_new, device=device)
        query_valid = row[None, :] < new_t[:, None]
        query_pos = torch.where(query_valid, cached_t[:, None] + row[None, :], 0)        # padding sees key 0
        key_pos = torch.arange(max_ctx, device=device)
        visible = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < ctx_t[:, None, None])
        return cls(k_pool, v_pool, as_tensor(slot_mapping), as_tensor(key_slots), as_tensor(query_index),
                   query_valid, visible)

    def attend(self, layer_idx: int, q, k, v):
        self.k_pool[layer_idx, self.slot_mapping] = k
        self.v_pool[layer_idx, self.slot_mapping] = v
        keys = self.k_pool[layer_idx, self.key_slots]              # (seqs, max_context, kv_heads, d)
        values = self.v_pool[layer_idx, self.key_slots]
        out = grouped_attention(q[self.query_index], keys, values, self.visible)  # (seqs, max_new, heads, d)
        return out[self.query_valid]                               # (tokens, heads, d), stream order
