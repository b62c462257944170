"""Chapter 13's checkers accept the worked solutions and reject typical wrong answers, saying what is wrong."""

import torch

from rosellm_edu.exercises.ch13 import check_apply_bitmask, check_bitmask_bytes, check_choice_allowed
from rosellm_edu.exercises.solutions.ch13 import apply_bitmask, bitmask_bytes, choice_allowed


def test_the_worked_solutions_pass():
    assert check_apply_bitmask(apply_bitmask)
    assert check_bitmask_bytes(bitmask_bytes)
    assert check_choice_allowed(choice_allowed)


def test_bits_read_from_the_wrong_end_of_a_word_are_rejected(capsys):
    def reversed_bits(logits, bitmask):
        bits = (bitmask[:, :, None] >> (31 - torch.arange(32, dtype=torch.int32))) & 1
        logits.masked_fill_(~bits.flatten(1)[:, :logits.shape[1]].bool(), float("-inf"))

    assert not check_apply_bitmask(reversed_bits)
    assert "✗ apply_bitmask" in capsys.readouterr().out


def test_a_bitmask_that_is_not_applied_in_place_is_rejected(capsys):
    assert not check_apply_bitmask(lambda logits, bitmask: logits.clone().fill_(float("-inf")))
    assert "✗ apply_bitmask" in capsys.readouterr().out


def test_a_byte_per_token_prediction_is_rejected(capsys):
    assert not check_bitmask_bytes(lambda rows, vocab: rows * vocab)
    assert "✗ bitmask_bytes" in capsys.readouterr().out


def test_a_mask_that_forgets_the_text_so_far_is_rejected(capsys):
    def no_prefix(prefix, choices, texts):
        return [i for i, t in enumerate(texts) if t and any(c.startswith(t) for c in choices)]

    assert not check_choice_allowed(no_prefix)
    assert "✗ choice_allowed" in capsys.readouterr().out
