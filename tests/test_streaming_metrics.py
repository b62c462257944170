"""Streaming deltas add up to the offline result; metrics match a plain re-computation; the bench command runs."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosellm_edu import LLM, SamplingParams
from rosellm_edu.benchmarks import mixed as bench
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.benchmarks.metrics import RequestTimes, summarize
from rosellm_edu.streaming import Request, stream

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colours:"]


def test_request_times_on_a_known_example():
    r = RequestTimes(arrival=0.5, token_times=[1.0, 2.0, 4.0], prompt_tokens=7)
    assert (r.ttft, r.e2e, r.tpot, r.itl) == (0.5, 3.5, 1.5, [1.0, 2.0])
    assert RequestTimes(0.0, [3.0]).tpot is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.lists(st.floats(0.001, 5), min_size=1, max_size=20)),
                min_size=1, max_size=15), st.floats(0.1, 100))
def test_summary_equals_a_plain_recomputation(requests, duration):
    times = [RequestTimes(a, list(a + np.cumsum(gaps)), 3) for a, gaps in requests]
    s = summarize(times, duration)
    n_tokens = sum(len(g) for _, g in requests)
    assert s["completion_tokens"] == n_tokens and s["prompt_tokens"] == 3 * len(requests)
    assert s["throughput_tok_s"] == pytest.approx(n_tokens / duration)
    ttft = [g[0] * 1000 for _, g in requests]
    assert s["ttft_ms"]["p50"] == pytest.approx(np.median(ttft), rel=1e-6, abs=1e-6)
    itl = [gap * 1000 for _, g in requests for gap in g[1:]]
    if itl:
        assert s["itl_ms"]["p99"] == pytest.approx(np.percentile(itl, 99), rel=1e-6, abs=1e-6)
    for key in ("ttft_ms", "e2e_ms"):
        assert s[key]["p50"] <= s[key]["p95"] + 1e-9 <= s[key]["p99"] + 2e-9


def test_stream_deltas_add_up_to_the_offline_outputs():
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (10, 6, 14)]
    params[2] = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, stop=[","])
    offline = LLM(dtype="float32").generate(PROMPTS, params, use_tqdm=False)
    requests = [Request(str(i), p, sp, arrival_time=0.05 * i) for i, (p, sp) in enumerate(zip(PROMPTS, params))]
    text, tokens, finished, first_time = {}, {}, {}, {}
    for d in stream(LLMEngine(dtype="float32"), requests):
        text[d.request_id] = text.get(d.request_id, "") + d.text
        tokens[d.request_id] = tokens.get(d.request_id, []) + d.token_ids
        first_time.setdefault(d.request_id, d.time)
        assert d.request_id not in finished, "a delta after the request finished"
        if d.finished:
            finished[d.request_id] = d.finish_reason
    for i, out in enumerate(offline):
        assert tokens[str(i)] == out.outputs[0].token_ids
        assert text[str(i)] == out.outputs[0].text
        assert finished[str(i)] == out.outputs[0].finish_reason
        assert first_time[str(i)] >= requests[i].arrival_time


def test_a_bad_request_in_a_stream_ends_with_an_error_and_the_others_finish():
    requests = [Request("good", "Hello", SamplingParams(temperature=0, max_tokens=4)),
                Request("empty", "", SamplingParams(max_tokens=4))]
    deltas = list(stream(LLMEngine(dtype="float32"), requests))
    bad = [d for d in deltas if d.request_id == "empty"]
    assert len(bad) == 1 and bad[0].finish_reason == "error" and "prompt is empty" in bad[0].error
    assert [d for d in deltas if d.request_id == "good"][-1].finished


def test_bench_command_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--workload", "equal", "--num-requests", "2", "--engines", "llm,naive", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "=== llm float32 ===" in printed and "TTFT p50/p95/p99" in printed
    results = json.loads(out.read_text())["results"]
    assert [r["engine"] for r in results] == ["llm", "naive"]
    assert all(r["completion_tokens"] == 2 * 64 and r["requests"] == 2 for r in results)
