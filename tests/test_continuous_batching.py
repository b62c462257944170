"""The continuous-batching engine: batched greedy output equals transformers one request at a time."""

import pytest

from conftest import assert_attention_matches_causal, hf_greedy
from rosellm_edu import LLM, SamplingParams
from rosellm_edu.engine.batch_attention import BatchAttention
from rosellm_edu.engine.continuous import ContinuousBatchingEngine


def test_batch_attention_equals_per_sequence_causal_attention():
    assert_attention_matches_causal(BatchAttention, [[3, 7, 1], [0, 2], [9, 4, 5, 6]], [5, 0, 9], [1, 7, 4])


PROMPTS = ["The capital of France is", "def quicksort(xs):", "Ingredients for pancakes:",
           "A long prompt about the history of computing. " * 10, "Hi"]


@pytest.mark.parametrize("engine_kwargs", [
    dict(),
    dict(max_num_seqs=2),
    dict(max_num_batched_tokens=16, block_size=4),
    dict(num_kv_blocks=24, block_size=8),   # only room for a few requests at a time
])
def test_batched_greedy_equals_transformers_one_at_a_time(hf_model, engine_kwargs):
    llm = LLM(engine_cls=ContinuousBatchingEngine, **engine_kwargs)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 5, 20, 8, 15)]
    for out, p in zip(llm.generate(PROMPTS, params, use_tqdm=False), params):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, p.max_tokens)
    assert llm.llm_engine.scheduler.allocator.free_blocks.__len__() == llm.llm_engine.pool.num_blocks


def test_requests_join_a_running_batch(hf_model, tokenizer):
    engine = ContinuousBatchingEngine()
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
    engine = ContinuousBatchingEngine(num_kv_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="needs .* KV blocks"):
        engine.add_request("big", "word " * 20, SamplingParams(max_tokens=4))
    engine.add_request("ok", "Hi", SamplingParams(temperature=0, max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.scheduler.allocator.free_blocks) == 4


def test_abort_frees_the_reservation():
    engine = ContinuousBatchingEngine(num_kv_blocks=32, block_size=4)
    engine.add_request("a", "Hello there", SamplingParams(max_tokens=20))
    engine.step()
    assert len(engine.scheduler.allocator.free_blocks) < 32
    engine.abort_request("a")
    assert len(engine.scheduler.allocator.free_blocks) == 32 and not engine.has_unfinished_requests()
    with pytest.raises(KeyError):
        engine.abort_request("a")
