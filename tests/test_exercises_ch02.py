"""Chapter 02's checkers turn down typical wrong answers and say what is wrong."""

import math

import torch

from rosellm_edu.exercises import ch02
from rosellm_edu.exercises.solutions import ch02 as solutions


def test_predicting_new_tokens_times_fewer_positions_is_rejected(capsys):
    assert not ch02.check_recompute_ratio(lambda prompt_len, new_tokens: new_tokens)
    out = capsys.readouterr().out
    assert "a 16-token prompt, 8 new tokens: you predicted 8x, the engine measured 6.783x" in out


def test_predicting_the_ratio_of_the_last_passes_is_rejected(capsys):
    assert not ch02.check_recompute_ratio(lambda prompt_len, new_tokens: prompt_len + new_tokens)
    assert "an estimate that models what the engine does lands within 0.9x to 1.1x" in capsys.readouterr().out


def attend(q, keys, values):
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("hd,mhd->hm", q, keys) / math.sqrt(q.shape[-1])
    return torch.einsum("hm,mhd->hd", scores.softmax(-1), values)


def test_decode_step_attending_over_the_whole_reserved_cache_is_caught(capsys):
    def whole_cache(q, k, v, k_cache, v_cache, length):
        k_cache[length], v_cache[length] = k, v
        return attend(q, k_cache, v_cache)                 # rows after `length` are not written yet

    assert not ch02.check_decode_step(whole_cache)
    assert "the first token (an empty cache): differs" in capsys.readouterr().out


def test_decode_step_that_leaves_out_its_own_key_is_caught(capsys):
    def without_itself(q, k, v, k_cache, v_cache, length):
        k_cache[length], v_cache[length] = k, v
        return attend(q, k_cache[:max(length, 1)], v_cache[:max(length, 1)])

    assert not ch02.check_decode_step(without_itself)
    assert "5 cached tokens: differs" in capsys.readouterr().out


def test_decode_step_that_does_not_write_the_cache_is_caught(capsys):
    def no_write(q, k, v, k_cache, v_cache, length):
        return attend(q, torch.cat([k_cache[:length], k[None]]), torch.cat([v_cache[:length], v[None]]))

    assert not ch02.check_decode_step(no_write)
    assert "must hold the new token's k and v" in capsys.readouterr().out


def test_decode_flops_without_attention_is_caught(capsys):
    def weights_only(config, context_len):
        return solutions.decode_flops(config, 0)

    assert not ch02.check_decode_flops(weights_only)
    assert "SmolLM2-135M with context_len=1" in capsys.readouterr().out


def test_decode_flops_charging_attention_per_kv_head_is_caught(capsys):
    def per_kv_head(config, context_len):
        d = solutions.head_dim_of(config)
        fewer = 4 * config.num_hidden_layers * (config.num_attention_heads - config.num_key_value_heads) * d
        return solutions.decode_flops(config, context_len) - fewer * context_len

    assert not ch02.check_decode_flops(per_kv_head)
    assert "SmolLM2-135M" in capsys.readouterr().out
