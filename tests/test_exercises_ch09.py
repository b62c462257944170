"""Chapter 09's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises.ch09 import check_decode_bytes, check_kv_rows_read, check_merge_splits


def test_a_prediction_that_reads_only_k_is_rejected(capsys):
    assert not check_decode_bytes(lambda lens, size: sum(lens) * 3 * 64 * size)
    out = capsys.readouterr().out
    assert out.startswith("✗ Predict the bytes of a decode step") and "0.50x of it" in out


def test_a_prediction_per_query_head_is_rejected(capsys):
    assert not check_decode_bytes(lambda lens, size: sum(lens) * 2 * 9 * 64 * size)
    assert "3.00x of it" in capsys.readouterr().out


def test_a_prediction_in_whole_blocks_is_exact(capsys):
    assert check_decode_bytes(lambda lens, size: sum(-(-n // 16) * 16 for n in lens) * 2 * 3 * 64 * size)
    assert "(1.00x of it" in capsys.readouterr().out


def test_a_merge_that_forgets_the_max_is_rejected(capsys):
    def unscaled(m, l, acc):
        return acc.sum(dim=0) / l.sum(dim=0)[:, None]

    assert not check_merge_splits(unscaled)
    assert "keys cut at" in capsys.readouterr().out


def test_a_merge_that_stumbles_on_an_empty_split_is_rejected(capsys):
    def nan_on_empty(m, l, acc):
        w = torch.exp(m - m.max(dim=0).values)
        w = torch.where(m == -torch.inf, torch.nan, w)            # as if exp(-inf - -inf)
        return (w[:, :, None] * acc).sum(dim=0) / (w * l).sum(dim=0)[:, None]

    assert not check_merge_splits(nan_on_empty)
    assert "[0, 4, 4, 7]" in capsys.readouterr().out


def test_counting_every_query_alone_is_rejected(capsys):
    def per_query(query_lens, context_lens, tile):
        return sum(c - n + j + 1 for n, c in zip(query_lens, context_lens) for j in range(n))

    assert not check_kv_rows_read(per_query)
    assert "tile=2" in capsys.readouterr().out
