"""Worked solutions for chapter 09's exercises."""

import torch


def decode_bytes(context_lens: list[int], bytes_per_element: int) -> int:
    kv_heads, head_dim = 3, 64                                 # SmolLM2: 9 query heads share 3 K/V heads
    per_token = 2 * kv_heads * head_dim * bytes_per_element    # a K row and a V row per K/V head
    return sum(context_lens) * per_token                       # every cached token once (blocks round it up a little)


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    top = m.max(dim=0).values                                  # (heads,): finite, some split saw a key
    w = torch.exp(m - top)                                     # (splits, heads); exp(-inf) = 0 for empty splits
    return (w[:, :, None] * acc).sum(dim=0) / (w * l).sum(dim=0)[:, None]


def kv_rows_read(query_lens: list[int], context_lens: list[int], tile: int) -> int:
    total = 0
    for n, context in zip(query_lens, context_lens):
        first = context - n                                    # position of the sequence's first new query
        for start in range(0, n, tile):
            last = first + min(start + tile, n) - 1            # the tile's last query
            total += last + 1                                  # it sees keys 0 .. last
    return total


SOLUTIONS = {"check_decode_bytes": decode_bytes, "check_merge_splits": merge_splits,
             "check_kv_rows_read": kv_rows_read}
