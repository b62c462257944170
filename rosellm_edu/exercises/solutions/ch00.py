"""Worked solutions to chapter 00's exercises."""

import math

import torch


def predict_parameters(config):
    hidden, layers, d = config.hidden_size, config.num_hidden_layers, config.hidden_size // config.num_attention_heads
    attention = hidden * (config.num_attention_heads + 2 * config.num_key_value_heads) * d  # qkv_proj: K, V per KV head
    attention += config.num_attention_heads * d * hidden                                   # o_proj
    mlp = 3 * hidden * config.intermediate_size                                            # gate, up, down
    norms = 2 * hidden                                                                     # two RMSNorms per layer
    embedding = config.vocab_size * hidden
    lm_head = 0 if config.tie_word_embeddings else config.vocab_size * hidden              # tied: the same weights
    return layers * (attention + mlp + norms) + embedding + hidden + lm_head               # + the final RMSNorm


def rope(x, positions, theta):
    head_dim = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (head_dim / 2,)
    angles = positions.float()[:, None] * inv_freq                          # (tokens, head_dim / 2)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]           # (tokens, 1, head_dim / 2)
    first, second = x[..., :head_dim // 2], x[..., head_dim // 2:]          # pair i is (i, i + head_dim / 2)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def causal_gqa(q, k, v):
    n, heads, d = q.shape
    m, kv_heads = k.shape[0], k.shape[1]
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)                                   # (m, heads, d): head h uses KV head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(d)              # (heads, n, m)
    query_pos = torch.arange(m - n, m)[:, None]                             # the queries are the last n positions
    scores = scores.masked_fill(torch.arange(m)[None, :] > query_pos, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(dim=-1), v)


SOLUTIONS = {"check_parameter_count": predict_parameters, "check_rope": rope, "check_causal_gqa": causal_gqa}
