"""Logprobs and prompt logprobs (chapter 06) against transformers' log_softmax of its own logits, in float32:
values, top-k sets and ranks, cumulative sums, chunked prefill, prefix caching, preemption, mixed batches; the
relation log pi_mask = log pi_full - log Z; min-p in the batched sampler against chapter 01's filter; penalties
through the engine against a plain re-computation over transformers' logits."""

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rosellm_edu import LLM
from rosellm_edu.engine.llm_engine import MAX_LOGPROBS, LLMEngine
from rosellm_edu.layers import sampler
from rosellm_edu.layers.sampler import draw_truncated, filtered_logits, sample, truncates
from rosellm_edu.sampling_params import SamplingParams

ATOL = 1e-4
PROMPTS = ["The capital of France is Paris, and the capital of Italy is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "Once upon a time, in a small village by the sea, there lived"]


@pytest.fixture(scope="module")
def engine_factory():
    made = []

    def make(**kwargs):
        kwargs = {"dtype": "float32", "num_kv_blocks": 128, "block_size": 4, **kwargs}
        made.append(LLMEngine(**kwargs))
        return made[-1]
    return make


def run(engine, requests: dict[str, tuple]) -> dict:
    """Add (prompt, params) per request id, step to the end; the final RequestOutput of each."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    return finals


def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V): transformers' log_softmax at every position; row i predicts token i + 1."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def assert_entry_matches(entry: dict, token: int, k: int, ref: torch.Tensor, tokenizer):
    """One {id: Logprob} against transformers' log-probabilities `ref` (V,) of that position: the token, with its
    rank (the tokens at least as likely, give or take rounding at a tie), then the top k, ranked 1..k."""
    assert token in entry and len(entry) in (k, k + 1)
    value = ref[token].item()
    assert abs(entry[token].logprob - value) < ATOL
    assert int((ref > value + ATOL).sum()) + 1 <= entry[token].rank <= int((ref >= value - ATOL).sum())
    top = ref.topk(k + 1)
    alternatives = {t: e for t, e in entry.items() if t != token or len(entry) == k}   # the top k
    assert sorted(e.rank for e in alternatives.values()) == list(range(1, k + 1))
    for t, e in alternatives.items():
        assert abs(e.logprob - ref[t].item()) < ATOL and abs(e.logprob - top.values[e.rank - 1].item()) < ATOL
    if k and top.values[k - 1] - top.values[k] > ATOL:                  # no tie at the border: the same ids
        assert set(alternatives) == set(top.indices[:k].tolist())
    for t, e in entry.items():
        assert e.decoded_token == tokenizer.decode([t])


def check_sample_logprobs(out, hf_model, tokenizer, k: int):
    c = out.outputs[0]
    ref = hf_logprobs(hf_model, out.prompt_token_ids + c.token_ids)
    start = len(out.prompt_token_ids) - 1
    assert len(c.logprobs) == len(c.token_ids)
    for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
        assert_entry_matches(entry, token, k, ref[start + i], tokenizer)
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)),
                                                 abs=1e-6)


def check_prompt_logprobs(out, hf_model, tokenizer, k: int):
    ids = out.prompt_token_ids
    ref = hf_logprobs(hf_model, ids)
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    for i in range(1, len(ids)):
        assert_entry_matches(out.prompt_logprobs[i], ids[i], k, ref[i - 1], tokenizer)


def test_sample_logprobs_equal_transformers_for_sampled_and_greedy_rows(engine_factory, hf_model, tokenizer):
    engine = engine_factory()
    finals = run(engine, {
        "sampled": (PROMPTS[0], SamplingParams(temperature=0.9, top_k=50, seed=3, max_tokens=8, logprobs=5)),
        "greedy": (PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, logprobs=0, ignore_eos=True)),
        "wide": (PROMPTS[2], SamplingParams(seed=4, max_tokens=8, logprobs=MAX_LOGPROBS, ignore_eos=True))})
    check_sample_logprobs(finals["sampled"], hf_model, tokenizer, 5)
    check_sample_logprobs(finals["greedy"], hf_model, tokenizer, 0)
    check_sample_logprobs(finals["wide"], hf_model, tokenizer, MAX_LOGPROBS)
    greedy = finals["greedy"].outputs[0]
    assert all(e[t].rank == 1 for t, e in zip(greedy.token_ids, greedy.logprobs))   # argmax: the most likely


def test_rows_without_logprobs_get_none_beside_rows_with_them(engine_factory, hf_model, tokenizer):
    engine = engine_factory()
    finals = run(engine, {
        "plain": (PROMPTS[0], SamplingParams(seed=1, max_tokens=6)),
        "greedy": (PROMPTS[1], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)),
        "two": (PROMPTS[2], SamplingParams(seed=2, top_p=0.9, max_tokens=6, logprobs=2, ignore_eos=True)),
        "prompt": (PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=1, ignore_eos=True))})
    for rid in ("plain", "greedy"):
        c = finals[rid].outputs[0]
        assert c.logprobs is None and c.cumulative_logprob is None and finals[rid].prompt_logprobs is None
    check_sample_logprobs(finals["two"], hf_model, tokenizer, 2)
    assert finals["two"].prompt_logprobs is None
    check_prompt_logprobs(finals["prompt"], hf_model, tokenizer, 1)
    assert finals["prompt"].outputs[0].logprobs is None
    # the rows beside each other sample what they sample alone
    alone = run(engine_factory(), {"two": (PROMPTS[2], SamplingParams(seed=2, top_p=0.9, max_tokens=6,
                                                                       ignore_eos=True))})
    assert alone["two"].outputs[0].token_ids == finals["two"].outputs[0].token_ids


def test_prompt_logprobs_equal_transformers_under_chunked_prefill(engine_factory, hf_model, tokenizer):
    engine = engine_factory(max_num_batched_tokens=5)      # prompts of 13-20 tokens: 3 or more chunks each
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3, logprobs=1, ignore_eos=True)
    finals = run(engine, {str(i): (p, params) for i, p in enumerate(PROMPTS)})
    for out in finals.values():
        assert len(out.prompt_token_ids) > 2 * 5
        check_prompt_logprobs(out, hf_model, tokenizer, 3)
        check_sample_logprobs(out, hf_model, tokenizer, 1)


def test_a_cached_prompt_still_gets_all_its_prompt_logprobs(engine_factory, hf_model, tokenizer):
    engine = engine_factory(enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2, ignore_eos=True)
    first = run(engine, {"first": (PROMPTS[2], params)})["first"]
    again = run(engine, {"again": (PROMPTS[2], params)})["again"]
    check_prompt_logprobs(again, hf_model, tokenizer, 2)
    for ours, before in zip(again.prompt_logprobs[1:], first.prompt_logprobs[1:]):
        assert ours.keys() == before.keys()
        assert [e.logprob for e in ours.values()] == pytest.approx([e.logprob for e in before.values()], abs=1e-5)
    assert engine.kv_cache_stats()["prefix_hit_rate"] == 0      # neither could use the cache ...
    run(engine, {"plain": (PROMPTS[2], SamplingParams(temperature=0, max_tokens=2))})
    assert engine.kv_cache_stats()["prefix_hit_rate"] > 0        # ... but the blocks are there for the others


def test_a_preempted_sequence_records_its_prompt_logprobs_once(hf_model, tokenizer):
    llm = LLM(dtype="float32", num_kv_blocks=20, block_size=4, max_num_batched_tokens=16)
    params = SamplingParams(seed=5, max_tokens=16, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for out in outs:
        check_prompt_logprobs(out, hf_model, tokenizer, 2)
        check_sample_logprobs(out, hf_model, tokenizer, 1)


def test_mask_logprob_is_full_logprob_minus_log_z_at_temperature_0_7(engine_factory, hf_model):
    engine = engine_factory()
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.02, seed=11, max_tokens=10,
                            ignore_eos=True, logprobs=0, return_sampling_mask=True)
    out = run(engine, {"r": (PROMPTS[2], params)})["r"]
    c = out.outputs[0]
    ids = out.prompt_token_ids + c.token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()            # (T, V)
    start = len(out.prompt_token_ids) - 1
    for i, token in enumerate(c.token_ids):
        row = logits[start + i]
        raw = row.log_softmax(-1)[token].item()
        full = (row / params.temperature).log_softmax(-1)[token].item()     # pi_full: after temperature
        masked = filtered_logits(row[None], params)[0].log_softmax(-1)[token].item()   # chapter 01's pi_mask
        assert c.logprobs[i][token].logprob == pytest.approx(raw, abs=ATOL)   # what logprobs report: the raw one
        assert masked == pytest.approx(full - c.sampling_logz[i], abs=ATOL)
        assert token in c.sampling_mask[i]
    assert any(abs(c.logprobs[i][t].logprob - (logits[start + i] / 0.7).log_softmax(-1)[t].item()) > 1e-2
               for i, t in enumerate(c.token_ids))                          # and raw is not pi_full here


def clear_of_rounding(row: torch.Tensor, p: SamplingParams, margin: float = 1e-5) -> bool:
    """Is min_p, and top_p after it, at least `margin` away from every boundary the row's probabilities make?"""
    z = row.double() / p.temperature
    probs = z.softmax(-1)
    ratio = probs / probs.max()
    if p.min_p > 0 and (ratio - p.min_p).abs().min() < margin:
        return False
    z = z.masked_fill(ratio < p.min_p, -torch.inf)
    k = p.top_k if 0 < p.top_k < len(row) else len(row)
    kept = z.sort(descending=True).values[:k].softmax(-1)
    return p.top_p >= 1 or (kept.cumsum(-1) - p.top_p).abs().min() >= margin


min_p_rows = st.builds(SamplingParams, temperature=st.floats(0.1, 2.5), top_k=st.sampled_from([0, 0, 5, 30]),
                       top_p=st.sampled_from([1.0, 1.0, 0.95, 0.6]), min_p=st.floats(0.001, 0.6))


@settings(max_examples=60, deadline=None)
@given(params=st.lists(min_p_rows, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1),
       candidates=st.sampled_from([4, 16, 1024]))
def test_min_p_in_the_batched_sampler_keeps_chapter_01s_distribution(params, seed, candidates):
    logits = torch.randn(len(params), 120, generator=torch.Generator().manual_seed(seed)) * 3
    assume(all(clear_of_rounding(row, p) for row, p in zip(logits, params)))
    assert all(truncates(p, 120) for p in params)
    expected = torch.stack([filtered_logits(r[None], p).softmax(-1)[0] for r, p in zip(logits, params)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler, "TOP_P_CANDIDATES", candidates)    # few candidates: the whole-vocabulary fallback too
        _, cand = draw_truncated(logits, params, [None] * len(params), None)
        ours = torch.zeros_like(logits).scatter(-1, cand.ids, cand.probs)
        for i in range(len(params)):
            if not cand.complete[i]:       # marked -1 and redone whole by sample()
                _, whole = draw_truncated(logits[i:i + 1], [params[i]], [None], None, whole=True)
                ours[i] = torch.zeros_like(logits[i]).scatter(-1, whole.ids[0], whole.probs[0])
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)
        # and through sample(): the mask is exactly chapter 01's support, the token inside it
        asking = [SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                                 return_sampling_mask=True) for p in params]
        out = sample(logits, asking, [None] * len(params), torch.Generator().manual_seed(seed))
    for i, (mask, token) in enumerate(zip(out.sampling_masks, out.token_ids)):
        assert mask == expected[i].nonzero()[:, 0].tolist() and token in mask


@pytest.fixture(scope="module")
def small_llm():
    return LLM(dtype="float32", num_kv_blocks=64, block_size=4)


def penalised_greedy(hf_model, prompt_ids: list[int], params: SamplingParams, n: int) -> list[int]:
    """Greedy decoding over transformers' logits with the penalties written out: repetition (transformers'
    RepetitionPenaltyLogitsProcessor on prompt and output), then OpenAI's frequency and presence on the output."""
    from transformers import RepetitionPenaltyLogitsProcessor

    repetition = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)
    out = []
    for _ in range(n):
        ids = torch.tensor([prompt_ids + out])
        with torch.no_grad():
            logits = hf_model(ids).logits[:, -1].float()                     # (1, V)
        logits = repetition(ids, logits)[0]
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("penalties", [dict(presence_penalty=2.0, frequency_penalty=1.0),
                                       dict(repetition_penalty=1.5, frequency_penalty=-0.5)])
def test_penalties_through_the_engine_equal_a_plain_recomputation(small_llm, hf_model, penalties):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, **penalties)
    llm = small_llm
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat"
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    ours = llm.generate([prompt, PROMPTS[1]], params, use_tqdm=False)   # two rows: the batched path
    for out in ours:
        assert out.outputs[0].token_ids == penalised_greedy(hf_model, out.prompt_token_ids, params, 10)
    assert ours[0].outputs[0].token_ids != plain[0].outputs[0].token_ids   # the penalties did change something


@pytest.mark.parametrize("field, params", [
    ("logit_bias", SamplingParams(logit_bias={10**7: 1.0})),
    ("stop_token_ids", SamplingParams(stop_token_ids=[-1])),
    ("logprobs", SamplingParams(logprobs=MAX_LOGPROBS + 1)),
    ("prompt_logprobs", SamplingParams(prompt_logprobs=MAX_LOGPROBS + 1))])
def test_the_engine_refuses_ids_outside_the_vocabulary_and_too_many_logprobs(engine_factory, field, params):
    engine = engine_factory()
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        engine.add_request("bad", "Hello", params)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("field, value", [("logprobs", -1), ("prompt_logprobs", 1.5), ("logprobs", True)])
def test_sampling_params_refuses_a_bad_logprobs_count(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})
