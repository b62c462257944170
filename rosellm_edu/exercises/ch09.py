"""Checkers for chapter 09's exercises: the positions of packed queries, merging split softmax results, the K/V
rows a tiled kernel reads."""

from __future__ import annotations

import math

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close, expect_equal

# (query_lens, context_lens): prefill chunks at offsets, fresh prompts, decode steps, mixed
BATCHES = [([2, 1], [5, 3]), ([4], [10]), ([1, 1, 1], [1, 7, 40]), ([37, 5, 1], [300, 5, 17]), ([16, 17], [16, 50])]


def _cu(query_lens: list[int]) -> list[int]:
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    return cu


def _positions(context_lens: list[int], cu: list[int]) -> list[int]:
    return [c - (cu[i + 1] - cu[i]) + j for i, c in enumerate(context_lens) for j in range(cu[i + 1] - cu[i])]


@checker("Where each packed query sits")
def check_query_positions(query_positions) -> str:
    for query_lens, context_lens in BATCHES:
        cu = _cu(query_lens)
        got = query_positions(list(context_lens), list(cu))
        expect_equal(list(got), _positions(context_lens, cu), f"query_positions({context_lens}, {cu})")
    return f"{len(BATCHES)} batches: chunks at offsets, fresh prompts and decode steps."


def _split_states(q, k, v, cuts):
    """The (m, l, acc) of each split of the keys, as the kernel's work items leave them."""
    ms, ls, accs = [], [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        if a == b:   # a split that saw no key
            ms.append(torch.full((q.shape[0],), -math.inf)), ls.append(torch.zeros(q.shape[0]))
            accs.append(torch.zeros(q.shape)); continue
        s = q @ k[a:b].T                                        # (heads, n)
        m = s.max(dim=1).values
        p = torch.exp(s - m[:, None])
        ms.append(m), ls.append(p.sum(dim=1)), accs.append(p @ v[a:b])
    return torch.stack(ms), torch.stack(ls), torch.stack(accs)


@checker("Merging any number of splits")
def check_merge_splits(merge_splits) -> str:
    g = torch.Generator().manual_seed(0)
    cases = [[0, 7], [0, 3, 7], [0, 1, 2, 3, 4, 5, 6, 7], [0, 4, 4, 7], [0, 0, 7]]
    for cuts in cases:
        q, k, v = torch.randn(3, 8, generator=g), torch.randn(7, 8, generator=g), torch.randn(7, 8, generator=g)
        k[2] *= 30                                             # one dominant key: a naive exp would overflow
        expected = torch.softmax(q @ k.T, dim=1) @ v
        got = merge_splits(*_split_states(q, k, v, cuts))
        if isinstance(got, torch.Tensor) and got.isnan().any():
            raise Mismatch(f"merge_splits, keys cut at {cuts}: NaN in the output (exp(-inf - -inf)?)")
        expect_close(got, expected, f"merge_splits, keys cut at {cuts}")
    return f"{len(cases)} ways to split 7 keys, empty splits included."


def _rows_read(query_lens: list[int], context_lens: list[int], tile: int) -> int:
    total = 0
    for n, c in zip(query_lens, context_lens):
        for start in range(0, n, tile):
            total += c - n + min(start + tile, n)               # keys seen by the tile's last query
    return total


@checker("What a tile saves")
def check_kv_rows_read(kv_rows_read) -> str:
    for query_lens, context_lens in BATCHES:
        for tile in (1, 2, 16, 64):
            expect_equal(kv_rows_read(list(query_lens), list(context_lens), tile),
                         _rows_read(query_lens, context_lens, tile),
                         f"kv_rows_read({query_lens}, {context_lens}, tile={tile})")
    return f"{len(BATCHES)} batches, tiles of 1, 2, 16 and 64 queries."
