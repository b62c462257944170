"""Worked solutions for chapter 08's exercises."""


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


def step_bytes(batch: int, context: int) -> float:
    weights = 134_515_008 * 2                       # every parameter once, in bfloat16 (the head is the embedding)
    kv_per_position = 2 * 30 * 3 * 64 * 2           # K and V, 30 layers, 3 KV heads of 64, bfloat16
    return weights + kv_per_position * batch * (context + 1)     # each sequence reads its context and the new one


def find_stop(text: str, searched: int, stops: list[str]) -> tuple[int, str] | None:
    hits = []
    for stop in stops:
        i = text.find(stop, max(0, searched - len(stop) + 1))   # an occurrence ending after `searched` starts here
        if i >= 0:
            hits.append((i, stop))
    return min(hits) if hits else None


SOLUTIONS = {"check_decode_flops": decode_flops, "check_step_bytes": step_bytes, "check_find_stop": find_stop}
