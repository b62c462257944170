"""Worked solutions for chapter 08's exercises."""

import math


def decode_flops(config, context_lens: list[int]) -> int:
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention_weights = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    mlp_weights = 3 * hidden * config.intermediate_size              # gate, up, down
    tokens = len(context_lens)
    matmuls = 2 * layers * (attention_weights + mlp_weights) * tokens + 2 * config.vocab_size * hidden * tokens
    keys_seen = sum(c + 1 for c in context_lens)                     # the new token sees itself too
    return matmuls + 4 * layers * heads * head_dim * keys_seen


def ridge_batch(params: int, weight_bytes: int, flops_per_s: float, bytes_per_s: float) -> int:
    # 2 · params · B / flops_per_s >= weight_bytes / bytes_per_s
    return max(1, math.ceil(weight_bytes * flops_per_s / (2 * params * bytes_per_s)))


def find_stop(text: str, searched: int, stops: list[str]) -> tuple[int, str] | None:
    hits = []
    for stop in stops:
        i = text.find(stop, max(0, searched - len(stop) + 1))   # an occurrence ending after `searched` starts here
        if i >= 0:
            hits.append((i, stop))
    return min(hits) if hits else None


SOLUTIONS = {"check_decode_flops": decode_flops, "check_ridge_batch": ridge_batch, "check_find_stop": find_stop}
