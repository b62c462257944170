"""Chapter 01's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises import ch01


def test_a_prediction_that_forgets_the_growing_sequence_is_rejected(capsys):
    assert not ch01.check_positions_computed(lambda prompt_tokens, new_tokens: prompt_tokens * new_tokens)
    out = capsys.readouterr().out
    assert out.startswith("✗ Predict the work of the naive loop") and "the engine measured 396 positions" in out


def test_a_prediction_that_assumes_a_kv_cache_is_rejected(capsys):
    assert not ch01.check_positions_computed(lambda prompt_tokens, new_tokens: prompt_tokens + new_tokens - 1)
    assert "lands within 0.9x to 1.1x" in capsys.readouterr().out


def test_the_exact_count_is_accepted(capsys):
    assert ch01.check_positions_computed(lambda p, n: n * p + n * (n - 1) // 2)
    assert "you predicted 348 positions, the engine measured 348 positions" in capsys.readouterr().out


def test_top_p_that_drops_the_crossing_token_is_rejected(capsys):
    def drops_crossing(logits, p):
        sorted_logits, order = logits.sort(descending=True)
        keep_sorted = sorted_logits.softmax(-1).cumsum(-1) <= p
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        return logits.masked_fill(~keep, float("-inf"))

    assert not ch01.check_top_p(drops_crossing)
    out = capsys.readouterr().out
    assert "you dropped the token that crosses top_p" in out


def test_top_p_that_forgets_to_sort_is_rejected(capsys):
    def unsorted(logits, p):
        probs = logits.softmax(-1)
        return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))

    assert not ch01.check_top_p(unsorted)
    assert "the most likely token must always stay: sort the probabilities" in capsys.readouterr().out


def test_stop_at_the_first_listed_stop_string_is_rejected(capsys):
    def list_order(text, stops):
        for stop in stops:
            if stop in text:
                return text[:text.index(stop)], stop
        return text, None

    assert not ch01.check_cut_at_stop(list_order)
    assert "'Blue' appears earlier in the text" in capsys.readouterr().out


def test_stop_that_keeps_the_stop_string_is_rejected(capsys):
    def keeps_it(text, stops):
        found = [(text.find(s), s) for s in stops if s in text]
        if not found:
            return text, None
        index, stop = min(found)
        return text[:index + len(stop)], stop

    assert not ch01.check_cut_at_stop(keeps_it)
    assert "you kept the stop string in the text" in capsys.readouterr().out
