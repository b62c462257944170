"""Chapter 01's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises import ch01


def test_top_k_that_keeps_one_token_too_many_is_rejected(capsys):
    def off_by_one(logits, k):
        if k <= 0 or k >= logits.shape[-1]:
            return logits
        kth = logits.topk(k + 1).values[-1]
        return logits.masked_fill(logits < kth, float("-inf"))

    assert not ch01.check_top_k(off_by_one)
    out = capsys.readouterr().out
    assert out.startswith("✗ Top-k filter") and "you keep 3 tokens, expected 2" in out


def test_top_k_that_zeroes_instead_of_minus_inf_is_rejected(capsys):
    def zeroes(logits, k):
        if k <= 0 or k >= logits.shape[-1]:
            return logits
        return logits.masked_fill(logits < logits.topk(k).values[-1], 0.0)

    assert not ch01.check_top_k(zeroes)
    assert "set them to -inf" in capsys.readouterr().out


def test_top_k_that_ignores_k_zero_is_rejected(capsys):
    def no_off_switch(logits, k):
        k = max(1, min(k, logits.shape[-1]))
        return logits.masked_fill(logits < logits.topk(k).values[-1], float("-inf"))

    assert not ch01.check_top_k(no_off_switch)
    assert "top_k=0 (off)" in capsys.readouterr().out


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
