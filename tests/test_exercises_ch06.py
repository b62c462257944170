"""Chapter 06's checkers reject typical wrong answers and say what is wrong, and its prediction checker rejects a
prediction far from the measurement."""

import torch

from rosellm_edu.exercises import ch06
from rosellm_edu.exercises.solutions.ch06 import batched_top_k_top_p, exponential_race, predict_kept


def test_a_prediction_of_ninety_percent_of_the_vocabulary_is_rejected(capsys):
    assert not ch06.check_top_p_prediction(lambda temperature: 900)
    out = capsys.readouterr().out
    assert "temperature 0.5: you predicted 900 tokens, the engine measured 12 tokens" in out and "0.8x to 1.25x" in out


def test_a_prediction_that_ignores_temperature_is_rejected(capsys):
    assert not ch06.check_top_p_prediction(lambda temperature: predict_kept(1.0))
    assert "temperature 0.5: you predicted 24 tokens" in capsys.readouterr().out


def test_the_continuous_estimate_is_accepted_and_a_non_number_is_named(capsys):
    assert ch06.check_top_p_prediction(lambda temperature: 23.03 * temperature)
    assert "temperature 2: you predicted 46.06 tokens, the engine measured 47 tokens" in capsys.readouterr().out
    assert not ch06.check_top_p_prediction(lambda temperature: "about 24")
    assert "predict a number, got str" in capsys.readouterr().out


def test_one_top_k_for_the_whole_batch_is_rejected(capsys):
    def second_rows_k_for_all(logits, temperature, top_k, top_p):
        return batched_top_k_top_p(logits, temperature, torch.full_like(top_k, int(top_k[1])), top_p)

    assert not ch06.check_batched_top_k_top_p(second_rows_k_for_all)
    out = capsys.readouterr().out
    assert "row 2" in out and "each row its own k and p" in out


def test_top_p_on_the_distribution_before_top_k_renormalises_is_rejected(capsys):
    def top_p_before_renormalising(logits, temperature, top_k, top_p):
        whole = batched_top_k_top_p(logits, temperature, torch.zeros_like(top_k), top_p)   # top-p on all V
        only_k = batched_top_k_top_p(logits, temperature, top_k, torch.ones_like(top_p))   # top-k alone
        probs = whole * (only_k > 0)
        return probs / probs.sum(dim=-1, keepdim=True)

    assert not ch06.check_batched_top_k_top_p(top_p_before_renormalising)
    assert "renormalised top-k" in capsys.readouterr().out


def test_multiplying_by_the_noise_instead_of_dividing_is_rejected(capsys):
    def times_noise(probs, generator):
        return (probs * torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)

    assert not ch06.check_exponential_race(times_noise)
    assert "standard deviations" in capsys.readouterr().out


def test_greedy_instead_of_a_draw_is_rejected(capsys):
    assert not ch06.check_exponential_race(lambda probs, generator: probs.argmax(dim=-1))
    assert "was drawn 1.0000 of the time" in capsys.readouterr().out


def test_noise_not_taken_from_the_generator_is_rejected(capsys):
    def global_rng(probs, generator):
        return exponential_race(probs, None)

    assert not ch06.check_exponential_race(global_rng)
    assert "same seed gave different draws" in capsys.readouterr().out
