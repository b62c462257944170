"""Chapter 02's exercises: the KV cache's size per token, one decode step of attention against cached K/V, and the
FLOPs of a decode step, checked against `engine.kv_cache.kv_cache_shape`, `layers.attention.causal_attention`
and the weights of `models.llama.LlamaForCausalLM`."""

import torch
from transformers import LlamaConfig

from rosellm_edu.exercises import Mismatch, checker, expect_close, expect_equal


def configs() -> list[tuple[str, LlamaConfig]]:
    """Llama-family shapes: SmolLM2-135M, a Llama-3-8B-like one, and one whose head_dim is not hidden / heads."""
    return [("SmolLM2-135M", LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         tie_word_embeddings=True)),
            ("a Llama-3-8B-like config", LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                                    num_hidden_layers=32, num_attention_heads=32,
                                                    num_key_value_heads=8, tie_word_embeddings=False)),
            ("a config with head_dim 128 != hidden / heads", LlamaConfig(
                vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=128))]


@checker("KV-cache bytes per token")
def check_kv_bytes_per_token(kv_bytes_per_token) -> str:
    """kv_bytes_per_token(config, dtype) -> int: the bytes one token's K and V take in every layer."""
    from rosellm_edu.engine.kv_cache import kv_cache_shape

    for name, config in configs():
        for dtype in (torch.float32, torch.bfloat16):
            layers, kv_heads, head_dim = kv_cache_shape(config)
            expected = 2 * layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
            expect_equal(kv_bytes_per_token(config, dtype), expected, f"{name} in {dtype}")
    return "right for every config and dtype (2 x layers x KV heads x head_dim x bytes per element)"


@checker("One decode step against cached K/V")
def check_decode_step(decode_step) -> str:
    """decode_step(q, k, v, k_cache, v_cache, length) -> (heads, d): write k, v at row `length`, attend over 0..length."""
    from rosellm_edu.layers.attention import causal_attention

    gen = torch.Generator().manual_seed(0)
    cases = [("the first token (an empty cache)", 0, 8, 4, 2), ("5 cached tokens", 5, 16, 4, 2),
             ("SmolLM2's heads, 100 cached tokens", 100, 128, 9, 3), ("no grouping, 7 cached", 7, 12, 4, 4),
             ("the last free row of the cache", 15, 16, 6, 2)]
    for what, length, max_len, heads, kv_heads in cases:
        q, k, v = (torch.randn(h, 8, generator=gen) for h in (heads, kv_heads, kv_heads))
        k_cache = torch.randn(max_len, kv_heads, 8, generator=gen)   # rows from `length` on are stale garbage
        v_cache = torch.randn(max_len, kv_heads, 8, generator=gen)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        k_ref[length], v_ref[length] = k, v
        expected = causal_attention(q[None], k_ref[:length + 1], v_ref[:length + 1])[0]
        got = decode_step(q.clone(), k.clone(), v.clone(), k_cache, v_cache, length)
        if not (torch.equal(k_cache[length], k) and torch.equal(v_cache[length], v)):
            raise Mismatch(f"{what}: row {length} of k_cache and v_cache must hold the new token's k and v")
        if not (torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)):
            raise Mismatch(f"{what}: rows other than {length} of the cache changed; write only the new row")
        expect_close(got, expected, what)
    return "appends one row and attends over every cached row, and only those"


@checker("FLOPs of a decode step")
def check_decode_flops(decode_flops) -> str:
    """decode_flops(config, context_len) -> int: multiply-adds x 2 of one token's forward pass and its logits."""
    from rosellm_edu.models.llama import LlamaForCausalLM

    for name, config in configs():
        with torch.device("meta"):                                     # shapes only, no memory
            model = LlamaForCausalLM(config)
        linears = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
        head_dim = model.model.layers[0].self_attn.head_dim
        for context_len in (1, 100, 4096):
            attention = 2 * 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * context_len
            expected = 2 * linears + 2 * model.lm_head.weight.numel() + attention
            got = decode_flops(config, context_len)
            if isinstance(got, float) and got.is_integer():
                got = int(got)
            expect_equal(got, expected, f"{name} with context_len={context_len}")
    return "counts the projections, the MLP, the LM head's one row and attention over the whole context"
