"""Chapter 00's exercises: a prediction of a model's parameter count from its config, measured on the built model;
rotary embeddings and causal grouped-query attention, each checked against the layer the chapter wrote
(`rosellm_edu.layers`)."""

import torch

from rosellm_edu.exercises import checker, compare_prediction, expect_close


def parameter_configs():
    """Llama-family shapes to predict: SmolLM2-135M (tied embedding), and a Llama-3-8B-like one (untied LM head)."""
    from transformers import LlamaConfig

    return [("SmolLM2-135M", LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         tie_word_embeddings=True)),
            ("a Llama-3-8B-like config", LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                                    num_hidden_layers=32, num_attention_heads=32,
                                                    num_key_value_heads=8, tie_word_embeddings=False))]


@checker("Predict the parameter count", predicts=True)
def check_parameter_count(predict_parameters) -> str:
    """predict_parameters(config) -> the parameters of LlamaForCausalLM(config), measured on the built model."""
    from rosellm_edu.models.llama import LlamaForCausalLM

    said = []
    for name, config in parameter_configs():
        predicted = predict_parameters(config)
        with torch.device("meta"):                                   # shapes only, no memory
            model = LlamaForCausalLM(config)
        measured = sum(p.numel() for p in model.parameters())      # a tied weight is one parameter, counted once
        said.append(compare_prediction(predicted, measured, f"{name}'s parameters", within=(0.97, 1.03)))
    return "; ".join(said)


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
