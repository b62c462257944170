"""Chapter 09's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises.ch09 import check_kv_rows_read, check_merge_splits, check_query_positions


def test_positions_from_the_start_of_the_context_are_rejected(capsys):
    def from_zero(context_lens, cu):
        return [j for i in range(len(context_lens)) for j in range(cu[i + 1] - cu[i])]

    assert not check_query_positions(from_zero)
    assert "query_positions([5, 3], [0, 2, 3])" in capsys.readouterr().out


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
