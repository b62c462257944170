"""The continuous-batching engine: batched greedy output equals transformers one request at a time."""

import pytest
import torch

from conftest import hf_greedy
from rosellm_edu import LLM, SamplingParams
from rosellm_edu.engine.batch_attention import BatchAttention
from rosellm_edu.engine.continuous import ContinuousBatchingEngine
from rosellm_edu.layers.attention import causal_attention


def test_batch_attention_equals_per_sequence_causal_attention():
    torch.manual_seed(0)
    layers, kv_heads, heads, d, block_size = 1, 2, 6, 8, 4
    k_pool = torch.zeros(layers, 40 * block_size, kv_heads, d)
    v_pool = torch.zeros_like(k_pool)
    tables = [[3, 7, 1], [0, 2], [9, 4, 5, 6]]
    cached, new = [5, 0, 9], [1, 7, 4]
    full_k = [torch.randn(c + n, kv_heads, d) for c, n in zip(cached, new)]
    full_v = [torch.randn(c + n, kv_heads, d) for c, n in zip(cached, new)]
    for table, c, k, v in zip(tables, cached, full_k, full_v):  # the cached part is already in the pool
        for i in range(c):
            slot = table[i // block_size] * block_size + i % block_size
            k_pool[0, slot], v_pool[0, slot] = k[i], v[i]
    q = [torch.randn(n, heads, d) for n in new]
    ctx = BatchAttention.build(k_pool, v_pool, block_size, tables, cached, new)
    out = ctx.attend(0, torch.cat(q), torch.cat([k[c:] for k, c in zip(full_k, cached)]),
                     torch.cat([v[c:] for v, c in zip(full_v, cached)]))
    expected = torch.cat([causal_attention(qi, ki, vi) for qi, ki, vi in zip(q, full_k, full_v)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


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
