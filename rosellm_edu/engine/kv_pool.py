# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import math

import torch

from rosellm_edu.kv_cache import kv_cache_shape


class KVPool:
    """The engine's KV storage: one (layers, slots, kv_heads, head_dim) tensor for K and one for V."""

    def __init__(self, config, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        layers, kv_heads, head_dim = kv_cache_shape(config)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k = torch.zeros(layers, num_blocks * block_size, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)


class ReservingAllocator:
    """Hands out whole reservations: a sequence gets every block it may need when it is admitted."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_blocks: list[int] = list(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def can_admit(self, max_tokens_total: int) -> bool:
        return self.blocks_needed(max_tokens_total) <= len(self.free_blocks)

    def admit(self, request_id: str, max_tokens_total: int) -> list[int]:
        n = self.blocks_needed(max_tokens_total)
        table, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        self.block_tables[request_id] = table
        return table

    def free(self, request_id: str) -> None:
        self.free_blocks.extend(self.block_tables.pop(request_id, []))
