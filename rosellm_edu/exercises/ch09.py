"""Checkers for chapter 09's exercises: a prediction of the bytes one decode attention call reads, measured on the
kernel's inputs; merging split softmax results; the K/V rows a tiled kernel reads."""

from __future__ import annotations

import math

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close, expect_equal

# (query_lens, context_lens): prefill chunks at offsets, fresh prompts, decode steps, mixed
BATCHES = [([2, 1], [5, 3]), ([4], [10]), ([1, 1, 1], [1, 7, 40]), ([37, 5, 1], [300, 5, 17]), ([16, 17], [16, 50])]


DECODE_CASES = [([16384], torch.bfloat16), ([1000, 37, 5], torch.float32)]   # (context_lens, dtype)


def _decode_inputs(context_lens: list[int], dtype: torch.dtype, block_size: int = 16):
    """SmolLM2's K/V pool for these sequences, their blocks shuffled, and the block tables (seqs, width) int32,
    as the decode kernel takes them."""
    from rosellm_edu.model_loader import load_config, resolve_model

    config = load_config(resolve_model())
    kv_heads, d = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    per_seq = [-(-n // block_size) for n in context_lens]
    k_cache = torch.zeros(sum(per_seq) + 8, block_size, kv_heads, d, dtype=dtype)   # 8 blocks nobody holds
    v_cache = torch.zeros_like(k_cache)
    order = torch.randperm(k_cache.shape[0], generator=torch.Generator().manual_seed(0)).tolist()
    tables = torch.zeros(len(context_lens), max(per_seq), dtype=torch.int32)
    for i, n in enumerate(per_seq):
        tables[i, :n], order = torch.tensor(order[:n]), order[n:]
    return k_cache, v_cache, tables


def _decode_bytes(context_lens: list[int], dtype: torch.dtype) -> int:
    """The bytes of the K and V blocks a decode call over these sequences must read: every block their tables
    reference, as the pool holds it."""
    k_cache, v_cache, tables = _decode_inputs(context_lens, dtype)
    used = {int(b) for i, n in enumerate(context_lens) for b in tables[i, :-(-n // k_cache.shape[1])]}
    return len(used) * (k_cache[0].nbytes + v_cache[0].nbytes)


@checker("Predict the bytes of a decode step", predicts=True)
def check_decode_bytes(predict_bytes) -> str:
    """predict_bytes(context_lens, bytes_per_element) -> the K/V bytes one layer's decode attention reads for
    SmolLM2, against the blocks the kernel's inputs reference."""
    sizes = [torch.empty(0, dtype=dtype).element_size() for _, dtype in DECODE_CASES]
    predictions = [predict_bytes(list(lens), size) for (lens, _), size in zip(DECODE_CASES, sizes)]
    said = [compare_prediction(predicted, _decode_bytes(lens, dtype), f"contexts {lens} in {str(dtype)[6:]}",
                               unit=" bytes")
            for (lens, dtype), predicted in zip(DECODE_CASES, predictions)]
    return "; ".join(said)


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
