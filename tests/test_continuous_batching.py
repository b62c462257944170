"""Continuous batching, as chapter 03 built it (blocks reserved up front) and as the package has it: batched greedy
output equals transformers one request at a time."""

import pytest

from conftest import assert_attention_matches_causal, chapter_class, hf_greedy
from rosellm_edu import LLM, SamplingParams

CHAPTER_03 = "04_paged_attention.ipynb"   # the package as chapter 03 left it


def chapter_03_engine(**kwargs):
    return chapter_class(CHAPTER_03, "engine.llm_engine", "LLMEngine")(dtype="float32", **kwargs)


def test_chapter_03_attention_equals_per_sequence_causal_attention():
    attention = chapter_class(CHAPTER_03, "layers.paged_attention", "PagedAttention")
    assert_attention_matches_causal(attention, [[3, 7, 1], [0, 2], [9, 4, 5, 6]], [5, 0, 9], [1, 7, 4])


PROMPTS = ["The capital of France is", "def quicksort(xs):", "Ingredients for pancakes:",
           "A long prompt about the history of computing. " * 10, "Hi"]


@pytest.mark.parametrize("engine_kwargs", [
    dict(),
    dict(max_num_seqs=2),
    dict(max_num_batched_tokens=16, block_size=4),
    dict(num_kv_blocks=24, block_size=8),   # only room for a few requests at a time
])
@pytest.mark.parametrize("chapter", ["chapter 03", "package"])
def test_batched_greedy_equals_transformers_one_at_a_time(hf_model, engine_kwargs, chapter):
    if chapter == "package":
        llm = LLM(dtype="float32", **engine_kwargs)
    else:
        llm = chapter_class(CHAPTER_03, "llm", "LLM")(dtype="float32", **{"num_kv_blocks": 512, **engine_kwargs})
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 5, 20, 8, 15)]
    for out, p in zip(llm.generate(PROMPTS, params, use_tqdm=False), params):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, p.max_tokens)
    engine = llm.llm_engine
    assert len(engine.scheduler.block_manager.free_blocks) == engine.kv_cache.num_blocks


def test_requests_join_a_running_batch(hf_model, tokenizer):
    engine = chapter_03_engine()
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine.add_request("a", "The capital of France is", params)
    engine.step(), engine.step()
    engine.add_request("b", "def quicksort(xs):", params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    for rid, prompt in [("a", "The capital of France is"), ("b", "def quicksort(xs):")]:
        assert finished[rid].outputs[0].token_ids == hf_greedy(hf_model, tokenizer(prompt).input_ids, 10)


def test_prompt_that_can_never_fit_is_refused_and_others_run():
    engine = chapter_03_engine(num_kv_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="needs .* KV blocks"):
        engine.add_request("big", "word " * 20, SamplingParams(max_tokens=4))
    engine.add_request("ok", "Hi", SamplingParams(temperature=0, max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.scheduler.block_manager.free_blocks) == 4


def test_abort_frees_the_reservation():
    engine = chapter_03_engine(num_kv_blocks=32, block_size=4)
    engine.add_request("a", "Hello there", SamplingParams(max_tokens=20))
    engine.step()
    assert len(engine.scheduler.block_manager.free_blocks) < 32
    engine.abort_request("a")
    assert len(engine.scheduler.block_manager.free_blocks) == 32 and not engine.has_unfinished_requests()
    engine.abort_request("a")   # already gone: ignored, as vLLM does
    engine.abort_request(["a", "never-added"])
    assert len(engine.scheduler.block_manager.free_blocks) == 32
