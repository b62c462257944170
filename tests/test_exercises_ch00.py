"""Chapter 00's checkers turn down typical wrong answers and say what is wrong."""

import copy
import math

import torch

from rosellm_edu.exercises import ch00
from rosellm_edu.exercises.solutions import ch00 as solutions


def test_a_parameter_count_that_counts_the_tied_lm_head_twice_is_rejected(capsys):
    def untied(config):
        return solutions.predict_parameters(config) + config.vocab_size * config.hidden_size * config.tie_word_embeddings

    assert not ch00.check_parameter_count(untied)
    out = capsys.readouterr().out
    assert "SmolLM2-135M's parameters: you predicted" in out and "an estimate that models" in out


def test_a_parameter_count_that_ignores_grouped_query_attention_is_rejected(capsys):
    def full_kv_heads(config):
        config = copy.deepcopy(config)
        config.num_key_value_heads = config.num_attention_heads
        return solutions.predict_parameters(config)

    assert not ch00.check_parameter_count(full_kv_heads)
    assert "you predicted" in capsys.readouterr().out


def test_a_parameter_count_without_the_norms_is_close_enough(capsys):
    def no_norms(config):
        return solutions.predict_parameters(config) - (2 * config.num_hidden_layers + 1) * config.hidden_size

    assert ch00.check_parameter_count(no_norms)
    assert "within 0.97x to 1.03x" in capsys.readouterr().out


def test_a_parameter_count_must_be_a_number(capsys):
    assert not ch00.check_parameter_count(lambda config: "135M")
    assert "predict a number, got str" in capsys.readouterr().out


def test_rope_with_interleaved_pairs_is_caught(capsys):
    def interleaved(x, positions, theta):  # GPT-J's pairs (2i, 2i + 1) instead of (i, i + d/2)
        d = x.shape[-1]
        angles = positions.float()[:, None] * theta ** (-torch.arange(0, d, 2).float() / d)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)

    assert not ch00.check_rope(interleaved)
    assert "positions 0..5" in capsys.readouterr().out


def test_rope_rotating_the_wrong_way_is_caught(capsys):
    def backwards(x, positions, theta):
        return solutions.rope(x, -positions, theta)

    assert not ch00.check_rope(backwards)
    assert "differs by up to" in capsys.readouterr().out


def test_attention_pairing_head_h_with_kv_head_h_mod_kv_heads_is_caught(capsys):
    def modulo_heads(q, k, v):
        heads, kv_heads = q.shape[1], k.shape[1]
        index = torch.arange(heads) % kv_heads              # wrong: query head h uses KV head h // group
        return solutions.causal_gqa(q, k[:, index], v[:, index])

    assert not ch00.check_causal_gqa(modulo_heads)
    assert "4 heads sharing 2 KV heads" in capsys.readouterr().out


def test_attention_with_a_top_left_causal_mask_is_caught_once_keys_are_cached(capsys):
    def top_left_mask(q, k, v):
        n, heads, d = q.shape
        group = heads // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(d)
        mask = torch.ones(n, k.shape[0], dtype=torch.bool).tril()   # query i sees keys 0..i, not 0..m-n+i
        return torch.einsum("hnm,mhd->nhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)

    assert not ch00.check_causal_gqa(top_left_mask)
    assert "one new query against 7 earlier keys" in capsys.readouterr().out
