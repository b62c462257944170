"""Worked solutions to chapter 02's exercises."""

import math

import torch


def head_dim_of(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def predict_ratio(prompt_len, new_tokens):
    uncached = sum(prompt_len + i for i in range(new_tokens))   # token i recomputes the prompt and i earlier tokens
    cached = prompt_len + new_tokens - 1                          # the prompt once, then the newest token per step
    return uncached / cached                                      # (the last token is sampled, never fed back)


def decode_step(q, k, v, k_cache, v_cache, length):
    k_cache[length], v_cache[length] = k, v                                # append the new token's row
    keys, values = k_cache[:length + 1], v_cache[:length + 1]              # (length + 1, kv_heads, d)
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,mhd->hm", q, keys) / math.sqrt(q.shape[-1])  # (heads, length + 1): no mask needed
    return torch.einsum("hm,mhd->hd", scores.softmax(dim=-1), values)      # (heads, d)


def decode_flops(config, context_len):
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    d = head_dim_of(config)
    per_layer = (hidden * (heads + 2 * kv_heads) * d      # qkv_proj
                 + heads * d * hidden                     # o_proj
                 + 3 * hidden * config.intermediate_size)  # gate, up and down
    attention = 2 * heads * d * context_len               # q·kᵀ and p·v, per layer
    lm_head = hidden * config.vocab_size                  # one row of logits
    return 2 * (config.num_hidden_layers * (per_layer + attention) + lm_head)


SOLUTIONS = {"check_recompute_ratio": predict_ratio, "check_decode_step": decode_step,
             "check_decode_flops": decode_flops}
