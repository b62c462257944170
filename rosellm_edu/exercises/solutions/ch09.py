"""Worked solutions for chapter 09's exercises."""

import torch


def query_positions(context_lens: list[int], cu_query_lens: list[int]) -> list[int]:
    positions = []
    for i, context in enumerate(context_lens):
        n = cu_query_lens[i + 1] - cu_query_lens[i]
        positions += range(context - n, context)              # the last n positions of the context
    return positions


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


SOLUTIONS = {"check_query_positions": query_positions, "check_merge_splits": merge_splits,
             "check_kv_rows_read": kv_rows_read}
