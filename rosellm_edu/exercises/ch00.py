"""Chapter 00's exercises: RMSNorm, rotary embeddings and causal grouped-query attention, each checked against the
layer the chapter wrote (`rosellm_edu.layers`)."""

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close


@checker("RMSNorm")
def check_rms_norm(rms_norm) -> str:
    """rms_norm(x, weight, eps): x (tokens, hidden), weight (hidden,) -> (tokens, hidden), like layers.norm.RMSNorm."""
    from rosellm_edu.layers.norm import RMSNorm

    gen = torch.Generator().manual_seed(0)
    cases = [("random float32 rows", torch.randn(5, 16, generator=gen), 1e-6),
             ("rows with a large mean", torch.randn(3, 8, generator=gen) + 10.0, 1e-6),
             ("tiny values, where eps matters", torch.randn(4, 8, generator=gen) * 1e-4, 1e-5),
             ("bfloat16 input (compute in float32, return bfloat16)", torch.randn(4, 32, generator=gen).bfloat16(), 1e-6)]
    for what, x, eps in cases:
        layer = RMSNorm(x.shape[-1], eps).to(x.dtype)  # a bfloat16 model has bfloat16 weights
        with torch.no_grad():
            layer.weight.copy_(torch.rand(x.shape[-1], generator=gen) + 0.5)
            expected = layer(x)
            got = rms_norm(x.clone(), layer.weight.detach().clone(), eps)
        if isinstance(got, torch.Tensor) and got.dtype != expected.dtype:
            raise Mismatch(f"{what}: dtype {got.dtype}, expected {expected.dtype} (the input's dtype)")
        expect_close(got, expected, what, atol=1e-2 if x.dtype == torch.bfloat16 else 1e-5)
    return "matches layers.norm.RMSNorm on float32 and bfloat16 rows, eps included"


@checker("Rotary position embedding")
def check_rope(rope) -> str:
    """rope(x, positions, theta): x (tokens, heads, head_dim) rotated at positions (tokens,), base theta."""
    from transformers import LlamaConfig

    from rosellm_edu.layers.rotary import RotaryEmbedding

    gen = torch.Generator().manual_seed(1)
    cases = [("positions 0..5, head_dim 8", torch.arange(6), 8, 10000.0),
             ("scattered positions, head_dim 16", torch.tensor([0, 7, 3, 31, 12]), 16, 10000.0),
             ("SmolLM2's base 100000, head_dim 64", torch.tensor([5, 6, 100, 200]), 64, 100000.0)]
    for what, positions, head_dim, theta in cases:
        config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, max_position_embeddings=256,
                             rope_parameters={"rope_type": "default", "rope_theta": theta})
        x = torch.randn(len(positions), 3, head_dim, generator=gen)
        expected, _ = RotaryEmbedding(config, head_dim)(positions, x, x[:, :1])
        expect_close(rope(x.clone(), positions.clone(), theta), expected, what)
    return "matches layers.rotary.RotaryEmbedding (pairs (i, i + d/2), angle position · theta^(-2i/d))"


@checker("Causal grouped-query attention")
def check_causal_gqa(attention) -> str:
    """attention(q, k, v): q (n, heads, d) for the last n of m positions; k, v (m, kv_heads, d) -> (n, heads, d)."""
    from rosellm_edu.layers.attention import causal_attention

    gen = torch.Generator().manual_seed(2)
    cases = [("a prompt: 6 queries, 6 keys, 4 heads sharing 2 KV heads", 6, 6, 4, 2),
             ("SmolLM2's grouping: 9 heads, 3 KV heads, 5 queries", 5, 5, 9, 3),
             ("one new query against 7 earlier keys (decode)", 1, 8, 6, 2),
             ("3 new queries after 5 cached keys", 3, 8, 4, 1),
             ("no grouping: as many KV heads as heads", 4, 4, 3, 3)]
    for what, n, m, heads, kv_heads in cases:
        q = torch.randn(n, heads, 8, generator=gen)
        k, v = torch.randn(m, kv_heads, 8, generator=gen), torch.randn(m, kv_heads, 8, generator=gen)
        expect_close(attention(q.clone(), k.clone(), v.clone()), causal_attention(q, k, v), what)
    return "matches layers.attention.causal_attention, with and without cached keys, grouped or not"
