"""Chapter 02's exercises: a prediction of the work a KV cache saves, measured by counting the token positions
that chapter 01's engine and the cached engine compute; one decode step of attention against cached K/V; and the
FLOPs of a decode step, checked against `layers.attention.causal_attention` and the weights of
`models.llama.LlamaForCausalLM`."""

import functools

import torch
from transformers import LlamaConfig

from rosellm_edu.exercises import (Mismatch, checker, compare_prediction, expect_close, expect_equal,
                                  tiny_model_dir)


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


def positions_computed(llm, params, prompt_len: int, new_tokens: int) -> int:
    """The token positions llm's model computes, over every forward pass, to generate new_tokens after a prompt."""
    rows = []
    hook = llm.llm_engine.model.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    try:
        llm.generate([{"prompt_token_ids": list(range(100, 100 + prompt_len))}],
                     params(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    finally:
        hook.remove()
    return sum(rows)


@functools.cache
def snapshot_llms() -> dict:
    """Chapter 01's LLM (no cache) and chapter 02's (a KV cache), each on the tiny model, with its SamplingParams."""
    from rosellm_edu.book.chapter import package_as_of

    engines = {}
    for role, notebook in [("uncached", "02_kv_cache.ipynb"), ("cached", "03_continuous_batching.ipynb")]:
        with package_as_of(notebook) as load:                    # the package as chapter 01, then 02, left it
            engines[role] = load("llm").LLM(tiny_model_dir(), dtype="float32"), load("sampling_params").SamplingParams
    return engines


@checker("Predict the work a cache saves", predicts=True)
def check_recompute_ratio(predict_ratio) -> str:
    """predict_ratio(prompt_len, new_tokens) -> how many times more token positions the model computes without a
    cache (chapter 01's engine) than with one (chapter 02's), measured on both engines."""
    cases = [(16, 8), (4, 16)]
    predicted = [predict_ratio(prompt_len, new_tokens) for prompt_len, new_tokens in cases]
    engines = snapshot_llms()
    said = []
    for (prompt_len, new_tokens), guess in zip(cases, predicted):
        measured = (positions_computed(*engines["uncached"], prompt_len, new_tokens)
                    / positions_computed(*engines["cached"], prompt_len, new_tokens))
        said.append(compare_prediction(guess, measured, f"a {prompt_len}-token prompt, {new_tokens} new tokens",
                                       within=(0.9, 1.1), unit="x"))
    return "; ".join(said)


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
