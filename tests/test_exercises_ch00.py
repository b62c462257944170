"""Chapter 00's checkers turn down typical wrong answers and say what is wrong."""

import math

import torch

from rosellm_edu.exercises import ch00
from rosellm_edu.exercises.solutions import ch00 as solutions


def test_rms_norm_without_eps_is_caught_on_tiny_values(capsys):
    def no_eps(x, weight, eps):
        x32 = x.float()
        return weight * (x32 / x32.pow(2).mean(-1, keepdim=True).sqrt()).to(x.dtype)

    assert not ch00.check_rms_norm(no_eps)
    assert "tiny values, where eps matters" in capsys.readouterr().out


def test_layer_norm_is_not_rms_norm(capsys):
    def layer_norm(x, weight, eps):
        x32 = x.float()
        x32 = (x32 - x32.mean(-1, keepdim=True)) / torch.sqrt(x32.var(-1, keepdim=True, unbiased=False) + eps)
        return weight * x32.to(x.dtype)

    assert not ch00.check_rms_norm(layer_norm)
    assert "differs by up to" in capsys.readouterr().out


def test_rms_norm_returning_float32_for_bfloat16_input_is_caught(capsys):
    def keeps_float32(x, weight, eps):
        return solutions.rms_norm(x.float(), weight, eps)

    assert not ch00.check_rms_norm(keeps_float32)
    assert "dtype torch.float32, expected torch.bfloat16" in capsys.readouterr().out


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
