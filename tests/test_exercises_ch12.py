"""Chapter 12's checkers accept the worked solutions and reject typical wrong answers, saying what is wrong."""

import torch

from rosellm_edu.exercises.ch12 import check_accepted_length, check_leftover_distribution, check_ngram_propose
from rosellm_edu.exercises.solutions.ch12 import accepted_length, leftover_distribution, ngram_propose


def test_the_worked_solutions_pass():
    assert check_ngram_propose(ngram_propose)
    assert check_accepted_length(accepted_length)
    assert check_leftover_distribution(leftover_distribution)


def test_ngram_propose_that_takes_the_earliest_match_is_rejected(capsys):
    def earliest(token_ids, k, min_n, max_n):
        for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
            for start in range(len(token_ids) - n):
                if token_ids[start:start + n] == token_ids[-n:]:
                    return token_ids[start + n:start + n + k]
        return []

    assert not check_ngram_propose(earliest)
    assert "✗ ngram_propose" in capsys.readouterr().out


def test_ngram_propose_that_matches_the_suffix_with_itself_is_rejected(capsys):
    def itself(token_ids, k, min_n, max_n):
        n = max_n
        return token_ids[len(token_ids):len(token_ids) + k] if len(token_ids) > n else []

    assert not check_ngram_propose(itself)
    assert "expected" in capsys.readouterr().out


def test_accepted_length_that_assumes_every_draft_independent_of_the_last_is_rejected(capsys):
    assert not check_accepted_length(lambda alpha, k: 1 + alpha * k)     # keeps drafts after a rejection
    out = capsys.readouterr().out
    assert "accepted_length(alpha=0.6, k=4)" in out and "you predicted" in out


def test_accepted_length_without_the_target_token_is_rejected(capsys):
    assert not check_accepted_length(lambda alpha, k: accepted_length(alpha, k) - 1)
    assert "✗ accepted_length" in capsys.readouterr().out


def test_accepted_length_that_forgets_k_is_rejected(capsys):
    assert not check_accepted_length(lambda alpha, k: 1 / (1 - alpha))  # as if k were unbounded
    assert "1.07x" in capsys.readouterr().out


def test_leftover_that_forgets_to_renormalise_is_rejected(capsys):
    assert not check_leftover_distribution(lambda p, q: (p - q).clamp_min(0))
    assert "norm(max(0, p - q))" in capsys.readouterr().out


def test_leftover_that_draws_from_p_again_is_rejected(capsys):
    assert not check_leftover_distribution(lambda p, q: p / p.sum())
    assert "✗ leftover_distribution" in capsys.readouterr().out
