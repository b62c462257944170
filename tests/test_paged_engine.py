"""LLMEngine: paged KV, prefix caching and preemption keep greedy output equal to transformers."""

import pytest

from conftest import assert_attention_matches_causal, hf_greedy
from rosellm_edu import LLM, LLMEngine, SamplingParams
from rosellm_edu.layers.paged_attention import PagedAttention

SYSTEM = "You are a helpful assistant who answers briefly and precisely. " * 3
PROMPTS = [SYSTEM + "What is the capital of France?", "def quicksort(xs):", SYSTEM + "Name a prime number.",
           "A long prompt about the history of computing. " * 10, "Hi", SYSTEM + "What is 2 + 2?"]
LENGTHS = (12, 5, 20, 8, 15, 9)


def test_paged_attention_equals_per_sequence_causal_attention():
    # a decode, a prefill, a chunk of a prefill, a decode
    assert_attention_matches_causal(PagedAttention, [[3, 7, 1], [0, 2], [9, 4, 5, 6], [11]], [5, 0, 9, 2], [1, 7, 4, 1])


def generate_and_check(hf_model, llm):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in LENGTHS]
    for out, p in zip(llm.generate(PROMPTS, params, use_tqdm=False), params):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, p.max_tokens)
    stats = llm.llm_engine.kv_cache_stats()
    assert stats["free_blocks"] == stats["total_blocks"]
    return stats


@pytest.mark.parametrize("engine_kwargs", [
    dict(),
    dict(enable_prefix_caching=False),
    dict(max_num_seqs=2, block_size=4),
    dict(max_num_batched_tokens=16, block_size=8),
])
def test_greedy_equals_transformers_one_at_a_time(hf_model, engine_kwargs):
    stats = generate_and_check(hf_model, LLM(dtype="float32", **engine_kwargs))
    if engine_kwargs.get("enable_prefix_caching") is False:
        assert stats["prefix_hit_rate"] == 0 and stats["cached_blocks"] == 0
    if engine_kwargs.get("max_num_seqs") == 2:              # later requests find the system prompt cached
        assert stats["prefix_hit_rate"] > 0


def test_preemption_under_a_tiny_kv_budget_loses_nothing(hf_model):
    llm = LLM(dtype="float32", num_kv_blocks=26, block_size=4)               # just room for the longest request alone
    generate_and_check(hf_model, llm)
    assert llm.llm_engine.scheduler.num_preemptions > 0


def test_prefix_cache_survives_the_request_and_is_reused(hf_model):
    llm = LLM(dtype="float32", block_size=4)
    generate_and_check(hf_model, llm)
    first = llm.llm_engine.kv_cache_stats()
    assert first["cached_blocks"] > 0
    generate_and_check(hf_model, llm)                       # the same prompts again: mostly hits
    assert llm.llm_engine.kv_cache_stats()["prefix_hit_rate"] > first["prefix_hit_rate"]


def test_requests_arriving_in_any_order(hf_model, tokenizer):
    engine = LLMEngine(dtype="float32", block_size=4, max_num_seqs=3)
    order = [3, 0, 5, 1, 4, 2]
    finished, added = {}, 0
    while added < len(order) or engine.has_unfinished_requests():
        if added < len(order):
            i = order[added]
            engine.add_request(str(i), PROMPTS[i], SamplingParams(temperature=0, max_tokens=LENGTHS[i], ignore_eos=True))
            added += 1
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
    for i, prompt in enumerate(PROMPTS):
        assert finished[str(i)] == hf_greedy(hf_model, tokenizer(prompt).input_ids, LENGTHS[i])


def test_bad_requests_get_clear_errors_and_harm_no_other(hf_model, tokenizer):
    engine = LLMEngine(dtype="float32", num_kv_blocks=8, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("good", "The capital of France is", params)
    engine.step()
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("empty", "", params)
    with pytest.raises(ValueError, match="context holds"):
        engine.add_request("long", {"prompt_token_ids": [1] * engine.max_model_len}, params)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("zero", "Hi", SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="needs .* KV blocks"):
        engine.add_request("huge", "word " * 40, params)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("good", "Hi", params)
    engine.abort_request("nobody")                      # an unknown id is ignored, as vLLM does
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].outputs[0].token_ids == hf_greedy(hf_model, tokenizer("The capital of France is").input_ids, 6)
    engine.abort_request("good")                        # so is a finished one
    assert engine.kv_cache_stats()["free_blocks"] == 8


def test_max_model_len_shortens_the_context_as_vllms_does(hf_model):
    llm = LLM(dtype="float32", max_model_len=24)
    prompt = "The capital of France is"
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 24
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, len(out.outputs[0].token_ids))
    with pytest.raises(ValueError, match="context holds 24"):
        llm.generate({"prompt_token_ids": [1] * 24}, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len=9000 is longer than the model's context"):
        LLMEngine(dtype="float32", max_model_len=9000)
