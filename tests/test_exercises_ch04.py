"""Chapter 04's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.engine.block_manager import chain_hash
from rosellm_edu.exercises import ch04
from rosellm_edu.exercises.solutions.ch04 import block_keys, merge, predicted_prompt_tokens


def test_the_engine_computes_the_prompt_tokens_the_worked_prediction_says():
    assert ch04.measured_prompt_tokens() == {(False, True): 128, (False, False): 128, (True, True): 128,
                                             (True, False): 72}
    assert all(predicted_prompt_tokens(*setting) == count for setting, count in ch04.measured_prompt_tokens().items())


def test_a_prediction_far_off_the_count_is_rejected_with_the_count(capsys):
    assert not ch04.check_prompt_tokens(lambda prefix_caching, together: 1000)
    out = capsys.readouterr().out
    assert out.startswith("✗ Predict the prefill, then measure it: prefix caching off, sent together: you "
                          "predicted 1000 tokens, the engine measured 128 tokens")


def test_a_prediction_that_expects_hits_for_requests_sent_together_is_rejected(capsys):
    assert not ch04.check_prompt_tokens(lambda prefix_caching, together: 72 if prefix_caching else 128)
    out = capsys.readouterr().out
    assert "prefix caching on, sent together" in out and "only once its K/V are computed" in out


def test_a_prediction_that_caches_the_repeated_prompt_whole_is_rejected(capsys):
    assert not ch04.check_prompt_tokens(lambda prefix_caching, together: 64 if prefix_caching and not together else 128)
    assert "its last token never is" in capsys.readouterr().out


def test_a_prediction_that_shares_tokens_not_blocks_is_rejected(capsys):
    assert not ch04.check_prompt_tokens(lambda prefix_caching, together: 52 if prefix_caching and not together else 128)
    assert "shares whole blocks only" in capsys.readouterr().out


def test_block_keys_that_are_not_chained_are_rejected(capsys):
    def unchained(token_ids, block_size):
        return [chain_hash(None, tuple(token_ids[s:s + block_size]))
                for s in range(0, len(token_ids) - block_size + 1, block_size)]

    assert not ch04.check_block_keys(unchained)
    out = capsys.readouterr().out
    assert out.startswith("✗ Chained block keys") and "key of block 1 differs" in out and "chain it" in out


def test_block_keys_for_a_partial_block_are_rejected(capsys):
    def with_partial(token_ids, block_size):
        keys, prev = [], None
        for s in range(0, len(token_ids), block_size):
            prev = chain_hash(prev, tuple(token_ids[s:s + block_size]))
            keys.append(prev)
        return keys

    assert not ch04.check_block_keys(with_partial)
    assert "only full blocks get a key" in capsys.readouterr().out


def test_a_merge_that_adds_without_rescaling_is_rejected(capsys):
    def unscaled(m1, l1, acc1, m2, l2, acc2):
        return torch.maximum(m1, m2), l1 + l2, acc1 + acc2

    assert not ch04.check_merge(unscaled)
    out = capsys.readouterr().out
    assert out.startswith("✗ Merging two partial softmax results") and "rescale each part by exp(m_i - m)" in out


def test_a_merge_that_rescales_the_wrong_way_is_rejected(capsys):
    def inverted(m1, l1, acc1, m2, l2, acc2):
        m = torch.maximum(m1, m2)
        a1, a2 = (m - m1).exp(), (m - m2).exp()
        return m, l1 * a1 + l2 * a2, acc1 * a1[:, None] + acc2 * a2[:, None]

    assert not ch04.check_merge(inverted)
    assert "l, the sum of exp(score - m)" in capsys.readouterr().out


def test_the_worked_solutions_pass(capsys):
    assert ch04.check_prompt_tokens(predicted_prompt_tokens) and ch04.check_block_keys(block_keys) \
        and ch04.check_merge(merge)
