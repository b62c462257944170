"""Requests as real clients write them, the parameters they send, logprobs/echo, n, and the operator's endpoints."""

import json

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from rosellm_edu import SamplingParams
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine

from test_server import ENGINE_KWARGS, MODEL, chat_ids, client, offline, server  # noqa: F401 (fixtures)


def offline_output(offline, prompt, **params):
    return offline.generate([prompt], SamplingParams(**params), use_tqdm=False)[0]


def post(server, path, body, **kw):
    return httpx.post(server[0].removesuffix("/v1") + path, json=body, timeout=120, **kw)


def recorded_params(server, monkeypatch) -> list:
    """Record the SamplingParams the server hands the engine."""
    engine, seen = server[1], []

    async def recording_add_request(request_id, prompt, params, priority=0):
        seen.append((prompt, params))
        return await AsyncLLMEngine.add_request(engine, request_id, prompt, params, priority)

    monkeypatch.setattr(engine, "add_request", recording_add_request)
    return seen


def test_content_parts_and_the_developer_role_mean_what_a_string_and_system_mean(client, offline):
    plain = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour.\nOne word."}]
    parts = [{"role": "developer", "content": [{"type": "text", "text": "You are terse."}]},
             {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Name a colour."},
                                                          {"type": "text", "text": "One word."}]}]
    ref = offline_output(offline, chat_ids(offline, plain), temperature=0, max_tokens=8).outputs[0]
    r = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == ref.text


def test_assistant_and_tool_turns_are_accepted(client):
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": None},
                {"role": "tool", "content": "4", "tool_call_id": "call_1"}, {"role": "user", "content": "So?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_image_parts_are_refused_naming_the_content(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"


def test_null_max_tokens_means_up_to_the_context(server, monkeypatch):
    seen = recorded_params(server, monkeypatch)
    limit = server[1].engine.max_model_len
    for path, body in [("/v1/completions", {"model": MODEL, "prompt": [504, 3458, 282], "max_tokens": None}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})]:
        with httpx.stream("POST", server[0].removesuffix("/v1") + path, json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_lines())   # leave after the first chunk: the request is aborted
    (_, completion), (chat_prompt, chat) = seen
    assert completion.max_tokens == limit - 3
    assert chat.max_tokens == limit - len(chat_prompt["prompt_token_ids"])


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**6}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 8192}),
])
def test_max_tokens_beyond_the_context_is_refused_not_capped(server, path, body):
    r = post(server, path, {"model": MODEL, **body})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "maximum context length" in error["message"]


def test_fields_at_their_no_op_value_are_accepted_and_logged_others_refused_by_name(server, caplog):
    ok = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "frequency_penalty": 0, "presence_penalty": 0,
          "response_format": {"type": "text"}, "tool_choice": "none", "best_of": 1, "some_new_field": None}
    with caplog.at_level("WARNING", logger="rosellm_edu.server"):
        assert post(server, "/v1/completions", ok).status_code == 200
    assert "some_new_field" in caplog.text and "tool_choice" in caplog.text
    for field, value in [("functions", [{"name": "f"}]), ("best_of", 3), ("temprature", 0.5),
                         ("modalities", ["text", "audio"])]:
        r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                  field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)


def test_error_messages_hold_no_internal_request_ids(server):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 10**6})   # too many blocks
    assert r.status_code == 400 and "cmpl-" not in r.json()["error"]["message"]


def test_penalties_bias_and_min_p_reach_the_sampler(client, offline):
    prompt = "Tell me about cats and cats and cats"
    params = dict(temperature=0, max_tokens=10, frequency_penalty=1.5, presence_penalty=0.5)
    extra = {"repetition_penalty": 1.3, "min_p": 0.1, "min_tokens": 4, "stop_token_ids": [13]}
    r = client.completions.create(model=MODEL, prompt=prompt, extra_body=extra, **params)
    ref = offline_output(offline, prompt, **params, **extra).outputs[0]
    plain = offline_output(offline, prompt, temperature=0, max_tokens=10).outputs[0]
    assert r.choices[0].text == ref.text != plain.text
    forced = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                       logit_bias={"7042": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == offline.get_tokenizer().decode([7042] * 3)


def test_a_batch_of_prompts_gets_one_choice_per_prompt(client, offline, server):
    prompts = ["The capital of France is", "Once upon a time"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0)
    refs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [ref.outputs[0].text for ref in refs]
    tok = offline.get_tokenizer()
    assert r.usage.prompt_tokens == sum(len(tok(p).input_ids) for p in prompts)
    chunks = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, stream=True))
    joined = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(2)]
    assert joined == [ref.outputs[0].text for ref in refs]


def test_continuous_usage_stats_count_every_token(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6 and chunks[-1].choices == []
    assert all(c.usage.prompt_tokens == chunks[0].usage.prompt_tokens for c in chunks)


def test_echo_logprobs_as_lm_eval_reads_them_equal_transformers_log_softmax(server, offline, hf_model):
    """lm-evaluation-harness' log-likelihood request: echo the prompt, 1 token, logprobs 1; it sums
    token_logprobs over the continuation and checks it was greedy against top_logprobs."""
    ids = offline.get_tokenizer()("The capital of France is Paris").input_ids
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": [ids], "echo": True, "logprobs": 1,
                                         "max_tokens": 1, "temperature": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)   # (tokens, vocab)
    expected = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx(expected.tolist(), abs=1e-4)
    for position, top in enumerate(lp["top_logprobs"][1:len(ids)]):
        assert max(top.values()) == pytest.approx(ref[position].max().item(), abs=1e-4)
        assert lp["token_logprobs"][position + 1] in top.values()
    text = r.json()["choices"][0]["text"]
    assert text.startswith("The capital of France is Paris") and lp["text_offset"][0] == 0
    assert all(text[o:o + len(t)] == t for o, t in zip(lp["text_offset"], lp["tokens"]))


def test_completion_logprobs_equal_the_offline_engines_streamed_or_not(client, offline):
    prompt, n = "The capital of France is", 5
    ref = offline_output(offline, prompt, temperature=0, max_tokens=n, logprobs=2, ignore_eos=True).outputs[0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([d[t].logprob for t, d in zip(ref.token_ids, ref.logprobs)])
    assert [len(top) for top in lp.top_logprobs] == [len(d) for d in ref.logprobs]
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, logprobs=2,
                                            stream=True, extra_body={"ignore_eos": True}))
    streamed = [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-4)   # a prefix-cache hit computes apart
    assert [o for c in chunks for o in c.choices[0].logprobs.text_offset] == lp.text_offset


def test_chat_logprobs_have_openais_shape_and_the_engines_values(client, offline):
    messages = [{"role": "user", "content": "Name a colour."}]
    ref = offline_output(offline, chat_ids(offline, messages), temperature=0, max_tokens=4, logprobs=3).outputs[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([d[t].logprob for t, d in zip(ref.token_ids, ref.logprobs)],
                                                         abs=1e-4)   # a prefix-cache hit computes apart
    for c, token, d in zip(content, ref.token_ids, ref.logprobs):
        assert c.bytes == list(c.token.encode()) and c.token == d[token].decoded_token
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(
            sorted((e.logprob for e in d.values() if e.rank <= 3), reverse=True), abs=1e-4)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True))
    streamed = [x.logprob for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([c.logprob for c in content], abs=1e-4)   # a prefix-cache hit computes apart


def test_n_samples_are_choices_indexed_per_sample_and_equal_the_offline_engines(client, offline):
    prompt = "My favourite food is"
    ref = offline_output(offline, prompt, n=3, temperature=1.0, seed=5, max_tokens=6)
    r = client.completions.create(model=MODEL, prompt=prompt, n=3, temperature=1.0, seed=5, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in ref.outputs]
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in ref.outputs)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, n=3, temperature=1.0, seed=5, max_tokens=6,
                                            stream=True))
    assert ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)] == \
        [c.text for c in ref.outputs]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                          max_tokens=3, seed=1)
    assert [c.index for c in chat.choices] == [0, 1]


def test_tokenize_and_detokenize_round_trip_as_vllm_has_them(server, offline):
    tok = offline.get_tokenizer()
    r = post(server, "/tokenize", {"model": MODEL, "prompt": "Hello, world!"}).json()
    assert r["tokens"] == tok("Hello, world!").input_ids and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == server[1].engine.max_model_len
    assert post(server, "/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json() == {"prompt": "Hello, world!"}
    messages = [{"role": "user", "content": "Hi"}]
    chat = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()
    assert chat["tokens"] == chat_ids(offline, messages)["prompt_token_ids"]
    assert post(server, "/detokenize", {"tokens": [10**9]}).status_code == 400


def test_models_report_the_context_length(client, server):
    assert client.models.list().data[0].model_dump()["max_model_len"] == server[1].engine.max_model_len


def test_metrics_parse_as_prometheus_text_and_count_the_requests(server, client):
    def scrape() -> dict:
        text = httpx.get(server[0].removesuffix("/v1") + "/metrics").text
        return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}

    before = scrape()
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
    after = scrape()
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert after[f"rosellm:{name}_count"] - before[f"rosellm:{name}_count"] == 2
    assert after["rosellm:generation_tokens_total"] - before["rosellm:generation_tokens_total"] == 6
    stats = server[1].engine.kv_cache_stats()
    assert after["rosellm:num_requests_running"] == after["rosellm:num_requests_waiting"] == 0
    assert after["rosellm:kv_cache_blocks_used"] == stats["total_blocks"] - stats["free_blocks"] == 0
    assert 0 <= after["rosellm:prefix_cache_hit_rate"] <= 1


def test_openapi_declares_400_not_422_and_the_response_models(server):
    schema = httpx.get(server[0].removesuffix("/v1") + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and "400" in responses and "413" in responses
    ok = schema["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/CompletionResponse") and "text/event-stream" in ok


def test_stop_string_kept_when_asked_and_special_tokens_shown_when_asked(client, offline):
    prompt = "Count: one, two, three, four,"
    extra = {"include_stop_str_in_output": True, "skip_special_tokens": False}
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[","],
                                  extra_body=extra)
    ref = offline_output(offline, prompt, max_tokens=12, temperature=0, stop=[","], **extra).outputs[0]
    without = offline_output(offline, prompt, max_tokens=12, temperature=0, stop=[","]).outputs[0]
    assert r.choices[0].text == ref.text == without.text + ","


@pytest.mark.parametrize("echo", [False, True])
def test_out_of_range_token_ids_are_a_400_naming_the_prompt_echoed_or_not(server, echo):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": [1, -5, 47], "max_tokens": 2, "echo": echo})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert httpx.get(server[0].removesuffix("/v1") + "/health").status_code == 200   # still serving
