"""Clients nobody here wrote, run unmodified against the server on loopback: the openai client, langchain-openai,
instructor, guidellm, lm-evaluation-harness (`local-completions`) and schemathesis.

What each client gets back is checked against a reference that does not go through the server: transformers in
float32 (greedy continuations, log-softmax), lm-eval's own `hf` backend on the same model, the server's own OpenAPI
schema, and for structured output the schema itself (jsonschema) and the client's own parsing. When a client
fails, the assertion names the exact requests the server refused and what it answered (tests/clients/recorder.py
keeps them), not the client's summary of it.

A test skips only when its client package is not installed (`pip install -e ".[test]"` installs them all)."""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import openai
import pytest
import torch
from pydantic import BaseModel

from clients.recorder import Recorder
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.server_thread import ServerThread

MODEL = "smollm2-test"
ENGINE_KWARGS = dict(dtype="float32", num_kv_blocks=512, block_size=16, max_num_seqs=64)
TASKS = Path(__file__).parent / "clients" / "lm_eval_tasks"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
LOGPROB_TOLERANCE = 1e-4   # float32 against float32: the issue's bound for lm-eval, used for every client here


@dataclass
class Served:
    url: str            # the OpenAI API's base URL, http://127.0.0.1:PORT/v1
    recorder: Recorder

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/v1")


@contextlib.contextmanager
def serving(api_key: str | None = None, **engine_kwargs):
    """The server as tests/test_server.py starts it, wrapped in a Recorder of refused requests."""
    engine = AsyncLLMEngine(LLMEngine(**engine_kwargs))
    recorder = Recorder(build_app(engine, MODEL, api_key=api_key))
    thread = ServerThread(recorder)
    try:
        yield Served(thread.start(), recorder)
    finally:
        thread.stop()
        engine.shutdown()


@pytest.fixture(scope="module")
def served():
    with serving(**ENGINE_KWARGS) as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


@contextlib.contextmanager
def refusals_shown(served: Served):
    """If the block raises, say which requests the server refused meanwhile, and its answers."""
    mark = len(served.recorder.failed)
    try:
        yield
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n\nrequests the server refused or failed:\n"
                             f"{served.recorder.since(mark)}") from e


# ---- references: transformers in float32, not through the server ----

def chat_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]


def hf_greedy_ids(hf_model, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> list[int]:
    """transformers' greedy continuation; with EOS (kept as the last id) unless ignore_eos."""
    eos = None if ignore_eos else hf_model.generation_config.eos_token_id
    out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False,
                            eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def hf_greedy_text(hf_model, tokenizer, prompt_ids: list[int], max_tokens: int) -> str:
    return tokenizer.decode(hf_greedy_ids(hf_model, prompt_ids, max_tokens), skip_special_tokens=True)


@torch.no_grad()
def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab): row t is log p(next token | ids[:t + 1]), the model's raw distribution."""
    return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def expected_logprobs(hf_model, prompt_ids: list[int], new_ids: list[int]) -> list[float]:
    rows = hf_logprobs(hf_model, prompt_ids + new_ids)[len(prompt_ids) - 1:-1]   # (len(new_ids), vocab)
    return [rows[i, t].item() for i, t in enumerate(new_ids)]


def expected_top(hf_model, tokenizer, prompt_ids: list[int], new_ids: list[int], k: int) -> list[dict[str, float]]:
    """Per generated position, the k most likely tokens (decoded) and their log-probabilities."""
    rows = hf_logprobs(hf_model, prompt_ids + new_ids)[len(prompt_ids) - 1:-1]
    top = rows.topk(k, dim=-1)
    return [{tokenizer.decode([i]): v for i, v in zip(ids.tolist(), vals.tolist())}
            for ids, vals in zip(top.indices, top.values)]


def assert_close_lists(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} values, expected {len(want)}"
    worst = max((abs(g - w) for g, w in zip(got, want)), default=0.0)
    assert worst <= LOGPROB_TOLERANCE, f"{what}: off by {worst:.2e}\n got  {got}\n want {want}"


def assert_top_matches(got: dict[str, float], want: dict[str, float], what: str) -> None:
    """The server's top alternatives hold the reference's top k (it may add the chosen token), same values."""
    missing = set(want) - set(got)
    assert not missing, f"{what}: {sorted(missing)} missing from {got}"
    assert_close_lists([got[t] for t in want], list(want.values()), what)


# ---- the openai client ----

def test_openai_sync_completion_and_chat_equal_transformers_greedy(served, client, hf_model, tokenizer):
    with refusals_shown(served):
        completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
        chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert completion.choices[0].text == hf_greedy_text(hf_model, tokenizer, tokenizer(PROMPT).input_ids, 8)
    assert chat.choices[0].message.content == hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, MESSAGES), 8)


def test_openai_async_client_serves_concurrent_requests(served, hf_model, tokenizer):
    prompts = ["The capital of France is", "One, two, three,", "def fibonacci(n):"]

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120) as aclient:
            async def streamed(prompt: str) -> str:
                stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                                          stream=True)
                return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

            async def whole(prompt: str) -> str:
                r = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
                return r.choices[0].text
            return await asyncio.gather(*(f(p) for p in prompts for f in (whole, streamed)))

    with refusals_shown(served):
        answers = asyncio.run(ask_all())
    expected = [hf_greedy_text(hf_model, tokenizer, tokenizer(p).input_ids, 8) for p in prompts for _ in range(2)]
    assert answers == expected


def test_openai_streams_join_to_the_whole_answer_and_end_with_usage(served, client, tokenizer):
    prompt_ids = tokenizer(PROMPT).input_ids
    common = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    with refusals_shown(served):
        whole = client.completions.create(prompt=PROMPT, **common)
        chunks = list(client.completions.create(prompt=PROMPT, stream=True, stream_options={"include_usage": True},
                                                **common))
        whole_chat = client.chat.completions.create(messages=MESSAGES, **common)
        chat_chunks = list(client.chat.completions.create(messages=MESSAGES, stream=True,
                                                          stream_options={"include_usage": True}, **common))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == len(prompt_ids)
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    joined = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert joined == whole_chat.choices[0].message.content
    assert chat_chunks[-1].choices == [] and chat_chunks[-1].usage.completion_tokens == 6
    assert chat_chunks[-1].usage.prompt_tokens == len(chat_ids(tokenizer, MESSAGES))


def test_openai_stream_with_continuous_usage_counts_every_chunks_tokens(served, client, tokenizer):
    """vLLM's stream_options.continuous_usage_stats, which benchmark clients count tokens with: every chunk's usage
    holds the tokens so far."""
    with refusals_shown(served):
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                                stream_options={"include_usage": True,
                                                                "continuous_usage_stats": True},
                                                extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(c.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids) for c in chunks)


def test_openai_completion_logprobs_equal_transformers_log_softmax(served, client, hf_model, tokenizer):
    prompt_ids = tokenizer(PROMPT).input_ids
    new_ids = hf_greedy_ids(hf_model, prompt_ids, 5, ignore_eos=True)
    with refusals_shown(served):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3,
                                      extra_body={"ignore_eos": True})
    logprobs = r.choices[0].logprobs
    assert logprobs.tokens == [tokenizer.decode([t]) for t in new_ids]
    assert_close_lists(logprobs.token_logprobs, expected_logprobs(hf_model, prompt_ids, new_ids), "token_logprobs")
    for i, want in enumerate(expected_top(hf_model, tokenizer, prompt_ids, new_ids, 3)):
        assert_top_matches(logprobs.top_logprobs[i], want, f"top_logprobs[{i}]")


def test_openai_echo_returns_the_prompts_logprobs_as_lm_eval_asks(served, client, hf_model, tokenizer):
    prompt_ids = tokenizer(PROMPT).input_ids
    with refusals_shown(served):   # lm-eval's log-likelihood request, sent by the openai client
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, echo=True)
    logprobs = r.choices[0].logprobs
    assert r.choices[0].text.startswith(PROMPT)
    assert logprobs.tokens[:len(prompt_ids)] == [tokenizer.decode([t]) for t in prompt_ids]
    assert logprobs.token_logprobs[0] is None   # nothing predicts the first token
    assert_close_lists(logprobs.token_logprobs[1:len(prompt_ids)],
                       expected_logprobs(hf_model, prompt_ids[:1], prompt_ids[1:]), "prompt token_logprobs")


def test_openai_chat_logprobs_equal_transformers_log_softmax(served, client, hf_model, tokenizer):
    prompt_ids = chat_ids(tokenizer, MESSAGES)
    new_ids = hf_greedy_ids(hf_model, prompt_ids, 5, ignore_eos=True)
    with refusals_shown(served):
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [tokenizer.decode([t]) for t in new_ids]
    assert_close_lists([c.logprob for c in content], expected_logprobs(hf_model, prompt_ids, new_ids), "logprob")
    for i, want in enumerate(expected_top(hf_model, tokenizer, prompt_ids, new_ids, 2)):
        assert len(content[i].top_logprobs) == 2
        assert_top_matches({t.token: t.logprob for t in content[i].top_logprobs}, want, f"top_logprobs[{i}]")


def test_openai_streamed_logprobs_equal_the_whole_response(served, client):
    common = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    with refusals_shown(served):
        whole = client.completions.create(prompt=PROMPT, logprobs=2, **common).choices[0].logprobs
        chunks = [c for c in client.completions.create(prompt=PROMPT, logprobs=2, stream=True, **common) if c.choices]
        whole_chat = client.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=2, **common)
        chat_chunks = [c for c in client.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=2,
                                                                 stream=True, **common) if c.choices]
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == whole.tokens
    assert_close_lists(sum((s.token_logprobs for s in streamed), []), whole.token_logprobs, "streamed logprobs")
    streamed_chat = sum((c.choices[0].logprobs.content for c in chat_chunks if c.choices[0].logprobs), [])
    assert [c.token for c in streamed_chat] == [c.token for c in whole_chat.choices[0].logprobs.content]
    assert_close_lists([c.logprob for c in streamed_chat], [c.logprob for c in whole_chat.choices[0].logprobs.content],
                       "streamed chat logprobs")


def test_openai_n_samples_are_the_seeded_single_samples(served, client, hf_model, tokenizer):
    """n greedy samples are all the greedy answer; sample i of a seeded request is the request with seed + i."""
    common = dict(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={"ignore_eos": True})
    with refusals_shown(served):
        greedy = client.completions.create(n=2, temperature=0, **common)
        sampled = client.completions.create(n=3, temperature=1.0, seed=11, **common)
        singles = [client.completions.create(n=1, temperature=1.0, seed=11 + i, **common) for i in range(3)]
        chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, temperature=1.0, seed=5,
                                              max_tokens=8)
        chat_singles = [client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.0, seed=5 + i,
                                                       max_tokens=8) for i in range(2)]
        streamed = list(client.completions.create(n=3, temperature=1.0, seed=11, stream=True, **common))
    greedy_text = tokenizer.decode(hf_greedy_ids(hf_model, tokenizer(PROMPT).input_ids, 8, ignore_eos=True))
    assert sorted(c.index for c in greedy.choices) == [0, 1]
    assert [c.text for c in greedy.choices] == [greedy_text] * 2
    assert [c.text for c in sorted(sampled.choices, key=lambda c: c.index)] == [s.choices[0].text for s in singles]
    assert greedy.usage.completion_tokens == 2 * 8 and sampled.usage.completion_tokens == 3 * 8
    assert ([c.message.content for c in sorted(chat.choices, key=lambda c: c.index)]
            == [s.choices[0].message.content for s in chat_singles])
    joined = {i: "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i) for i in range(3)}
    assert [joined[i] for i in range(3)] == [s.choices[0].text for s in singles]


def test_openai_messages_as_clients_write_them(served, client):
    """Content as a list of text parts and response_format text give the plain request's answer; the developer
    role and a participant's name are accepted."""
    common = dict(model=MODEL, max_tokens=8, temperature=0)
    parts = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]}]
    with refusals_shown(served):
        plain = client.chat.completions.create(messages=MESSAGES, **common)
        as_parts = client.chat.completions.create(messages=parts, response_format={"type": "text"}, **common)
        developer = client.chat.completions.create(
            messages=[{"role": "developer", "content": "Answer in one word."},
                      {"role": "user", "content": "Name a colour.", "name": "ann"}], **common)
    assert as_parts.choices[0].message.content == plain.choices[0].message.content
    assert developer.choices[0].finish_reason in ("stop", "length")


# ---- the openai client's Responses API (/v1/responses) ----

def test_openai_responses_sync_async_and_streamed_equal_transformers_greedy(served, client, hf_model, tokenizer):
    """responses.create whole (sync and async) and streamed (stream=True, and responses.stream with its final
    response): each is transformers' greedy answer to the same question as a chat message."""
    common = dict(model=MODEL, input=MESSAGES[0]["content"], max_output_tokens=16, temperature=0)

    async def ask_async() -> str:
        async with openai.AsyncOpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120) as aclient:
            return (await aclient.responses.create(**common)).output_text

    with refusals_shown(served):
        whole = client.responses.create(**common)
        in_async = asyncio.run(ask_async())
        events = list(client.responses.create(stream=True, **common))
        with client.responses.stream(**common) as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    prompt_ids = chat_ids(tokenizer, MESSAGES)
    expected_ids = hf_greedy_ids(hf_model, prompt_ids, 16)
    expected = tokenizer.decode(expected_ids, skip_special_tokens=True)
    assert whole.status == "completed" and whole.output_text == in_async == expected
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-1].type == "response.completed" and events[-1].response.output_text == expected
    assert "".join(deltas) == final.output_text == expected
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (len(prompt_ids), len(expected_ids))


def test_openai_responses_history_from_an_earlier_output_is_the_chat_conversation(served, client, hf_model,
                                                                                  tokenizer):
    """OpenAI's way to go on with a conversation without a store: the earlier response's output items go back as
    input, beside the new user message."""
    first_turn = [{"role": "user", "content": "Name a colour."}]
    with refusals_shown(served):
        first = client.responses.create(model=MODEL, input=first_turn, max_output_tokens=16, temperature=0)
        second = client.responses.create(model=MODEL, max_output_tokens=16, temperature=0,
                                         input=[*first_turn, *first.output, {"role": "user", "content": "Another."}])
    history = [*first_turn, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Another."}]
    assert second.output_text == hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, history), 16)


def test_openai_responses_cut_by_max_output_tokens_are_incomplete(served, client, hf_model, tokenizer):
    common = dict(model=MODEL, input=MESSAGES[0]["content"], max_output_tokens=3, temperature=0)
    with refusals_shown(served):
        whole = client.responses.create(**common)
        events = list(client.responses.create(stream=True, **common))
    expected = hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, MESSAGES), 3)
    assert (whole.status, whole.incomplete_details.reason, whole.output_text) == \
           ("incomplete", "max_output_tokens", expected)
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == expected


def test_openai_responses_store_and_tools_are_refused_naming_the_field(served, client):
    for field, value in [("store", True), ("previous_response_id", "resp_0"), ("tools", [{"type": "web_search"}])]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, **{field: value})
        assert refused.value.body["param"] == field


# ---- langchain-openai ----

def test_langchain_chat_openai_plain_and_streamed_equal_transformers_greedy(served, hf_model, tokenizer):
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0,
                                       max_tokens=8, max_retries=0)
    question = MESSAGES[0]["content"]
    with refusals_shown(served):
        answer = chat.invoke(question).content
        streamed = "".join(chunk.content for chunk in chat.stream(question))
    expected = hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, MESSAGES), 8)
    assert answer == expected and streamed == expected


def test_langchain_chat_openai_responses_api_invoke_and_stream_equal_transformers_greedy(served, hf_model, tokenizer):
    """ChatOpenAI(use_responses_api=True) sends a system message and the history as Responses input items (an
    earlier answer as output_text parts): invoke and stream give transformers' greedy answer to that conversation."""
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0,
                                       max_tokens=16, max_retries=0, use_responses_api=True)
    turns = [("system", "You are terse."), ("user", "Name a colour."), ("assistant", "Blue."),
             ("user", "Another one.")]
    with refusals_shown(served):
        answer = chat.invoke(MESSAGES[0]["content"])
        streamed = "".join(chunk.text for chunk in chat.stream(MESSAGES[0]["content"]))
        conversation = chat.invoke([("ai" if role == "assistant" else role, text) for role, text in turns]).text
    expected = hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, MESSAGES), 16)
    assert answer.text == expected and streamed == expected
    assert answer.usage_metadata["input_tokens"] == len(chat_ids(tokenizer, MESSAGES))
    history = [{"role": role, "content": text} for role, text in turns]
    assert conversation == hf_greedy_text(hf_model, tokenizer, chat_ids(tokenizer, history), 16)


def test_langchain_chat_openai_logprobs_equal_transformers_log_softmax(served, hf_model, tokenizer):
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0,
                                       max_tokens=5, max_retries=0, logprobs=True,
                                       extra_body={"ignore_eos": True})
    prompt_ids = chat_ids(tokenizer, MESSAGES)
    new_ids = hf_greedy_ids(hf_model, prompt_ids, 5, ignore_eos=True)
    with refusals_shown(served):
        content = chat.invoke(MESSAGES[0]["content"]).response_metadata["logprobs"]["content"]
    assert [c["token"] for c in content] == [tokenizer.decode([t]) for t in new_ids]
    assert_close_lists([c["logprob"] for c in content], expected_logprobs(hf_model, prompt_ids, new_ids), "logprob")


# ---- structured output and tool calls (appendix 13a): each parsed result checked against its schema ----

class City(BaseModel):
    name: str
    country: str


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CITY_QUESTION = [{"role": "user", "content": "Name a city in France, as JSON."}]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_openai_parse_with_a_pydantic_model_gives_an_instance_of_the_model(served, client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    with refusals_shown(served):
        completion = parse(model=MODEL, messages=CITY_QUESTION, response_format=City, temperature=0, max_tokens=60)
    message = completion.choices[0].message
    jsonschema.validate(json.loads(message.content), City.model_json_schema())
    assert message.parsed == City.model_validate_json(message.content)
    assert completion.choices[0].finish_reason == "stop"


def test_openai_response_format_json_schema_answer_follows_the_schema(served, client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "country": {"enum": ["France", "Spain"]}},
              "required": ["city", "country"], "additionalProperties": False}
    with refusals_shown(served):
        completion = client.chat.completions.create(
            model=MODEL, messages=CITY_QUESTION, temperature=0, max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].message.content), schema)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_forced_tool_calls_name_a_tool_and_follow_its_schema(served, client, tool_choice):
    with refusals_shown(served):
        completion = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL],
                                                    tool_choice=tool_choice, temperature=0, max_tokens=60)
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


def test_openai_streamed_tool_calls_reassemble_to_the_whole_answer(served, client):
    ask = dict(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice="required", temperature=0,
               max_tokens=60)
    with refusals_shown(served):
        whole = client.chat.completions.create(**ask).choices[0].message.tool_calls
        with client.chat.completions.stream(**ask) as stream:   # the client's own accumulator joins the deltas
            final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in whole]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output_gives_a_valid_instance(served, method):
    """json_schema sends response_format (strict); function_calling sends the model as a tool, named in
    tool_choice. Either way langchain parses the answer into the pydantic model."""
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0,
                                       max_tokens=60, max_retries=0)
    with refusals_shown(served):
        city = chat.with_structured_output(City, method=method).invoke("Name a city in France.")
    assert isinstance(city, City)
    assert City.model_validate(city.model_dump()) == city


def test_langchain_bind_tools_round_trip(served):
    """The loop of langchain's tool-calling agents: the model calls, the tool runs, its result goes back as a
    ToolMessage beside the AIMessage that called, and the model answers."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city, now."""
        return json.dumps({"city": city, "sky": "clear"})

    chat = langchain_openai.ChatOpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0,
                                       max_tokens=40, max_retries=0)
    messages = [HumanMessage("What is the weather in Paris?")]
    with refusals_shown(served):
        called = chat.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
        assert [c["name"] for c in called.tool_calls] == ["get_weather"] and not called.invalid_tool_calls
        jsonschema.validate(called.tool_calls[0]["args"], get_weather.tool_call_schema.model_json_schema())
        messages += [called, ToolMessage(get_weather.invoke(called.tool_calls[0]["args"]),
                                         tool_call_id=called.tool_calls[0]["id"])]
        answer = chat.bind_tools([get_weather]).invoke(messages)
    assert answer.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert isinstance(answer.content, str) and (answer.content or answer.tool_calls)


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_gives_a_valid_instance(served, client, mode):
    instructor = pytest.importorskip("instructor")
    patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    with refusals_shown(served):
        city = patched.chat.completions.create(model=MODEL, messages=CITY_QUESTION, response_model=City,
                                               temperature=0, max_tokens=60, max_retries=0)
    assert isinstance(city, City)   # instructor's own parsing; the fields again against the schema:
    jsonschema.validate(city.model_dump(), City.model_json_schema())


def test_langchain_openai_completions_class_equals_transformers_greedy(served, hf_model, tokenizer):
    """langchain's OpenAI completions class always sends frequency_penalty: 0 and presence_penalty: 0."""
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.OpenAI(model=MODEL, base_url=served.url, api_key="unused", temperature=0, max_tokens=8,
                                  max_retries=0)
    with refusals_shown(served):
        answer = llm.invoke(PROMPT)
        streamed = "".join(llm.stream(PROMPT))
    expected = hf_greedy_text(hf_model, tokenizer, tokenizer(PROMPT).input_ids, 8)
    assert answer == expected and streamed == expected


# ---- guidellm: all four modes, a short synchronous profile on synthetic prompts ----

GUIDELLM_MODES = {"completions": ("/v1/completions", False), "completions-stream": ("/v1/completions", True),
                  "chat": ("/v1/chat/completions", False), "chat-stream": ("/v1/chat/completions", True)}
GUIDELLM_REQUESTS, GUIDELLM_PROMPT_TOKENS, GUIDELLM_OUTPUT_TOKENS = 3, 16, 8


def guidellm_command(served: Served, embedded_dir: Path, endpoint: str, stream: bool, report: Path) -> list[str]:
    """`guidellm run` as its README shows it; the tokenizer that counts synthetic prompts is the local model."""
    backend = f"kind=openai_http,target={served.origin},model={MODEL},request_format={endpoint},stream={stream}"
    return [str(Path(sys.executable).parent / "guidellm"), "run", "--backend", backend,
            "--profile", "kind=synchronous",
            "--constraint", f"kind=max_requests,count={GUIDELLM_REQUESTS}",
            "--tokenizer", f"kind=huggingface_auto,model={embedded_dir}",
            "--data", f"kind=synthetic_text,prompt_tokens={GUIDELLM_PROMPT_TOKENS},"
                      f"output_tokens={GUIDELLM_OUTPUT_TOKENS}",
            "--output", f"kind=json,path={report}", "--disable-console-interactive"]


@pytest.fixture(scope="module")
def guidellm_runs(served, embedded_dir, tmp_path_factory):
    """The four modes run at once (each is mostly guidellm's start-up): mode -> (report or None, log tail)."""
    pytest.importorskip("guidellm")
    folder = tmp_path_factory.mktemp("guidellm")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    procs = {}
    for mode, (endpoint, stream) in GUIDELLM_MODES.items():
        log = open(folder / f"{mode}.log", "w")
        procs[mode] = subprocess.Popen(guidellm_command(served, embedded_dir, endpoint, stream, folder / f"{mode}.json"),
                                       stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)
    runs = {}
    for mode, proc in procs.items():
        proc.wait(timeout=300)
        report = folder / f"{mode}.json"
        log = (folder / f"{mode}.log").read_text()[-3000:]
        runs[mode] = (json.loads(report.read_text()) if report.exists() else None, log)
    return runs


@pytest.mark.parametrize("mode", GUIDELLM_MODES)
def test_guidellm_mode_completes_every_request(mode, served, guidellm_runs):
    report, log = guidellm_runs[mode]
    endpoint, stream = GUIDELLM_MODES[mode]
    refused = "\n".join(str(e) for e in served.recorder.failed if e.path == endpoint) or "(none)"
    assert report is not None, f"guidellm wrote no report:\n{log}"
    requests = report["benchmarks"][0]["requests"]
    errors = [r["info"]["error"] for r in requests["errored"] + requests["incomplete"]]
    assert errors == [], f"{len(errors)} requests failed: {errors[:2]}\n\nthe server refused:\n{refused}"
    done = requests["successful"]
    # Under load guidellm can end a run while the last request's result is still on its way back from its worker
    # process: its report then counts that request as "processing", with no error (the server's log shows the
    # answer sent in full). At most that one; every other request must have come back whole.
    in_flight = report["benchmarks"][0]["scheduler_state"]["processing_requests"]
    assert len(done) + in_flight == GUIDELLM_REQUESTS and in_flight <= 1, (len(done), in_flight)
    # guidellm sends ignore_eos with max_tokens, so each request makes exactly the tokens it asked for
    assert [r["output_metrics"]["text_tokens"] for r in done] == [GUIDELLM_OUTPUT_TOKENS] * len(done)
    if stream:   # a streamed request's first token was seen before its last one
        assert all(r["info"]["timings"]["first_token_iteration"] < r["info"]["timings"]["last_token_iteration"]
                   for r in done)


# ---- lm-evaluation-harness: local-completions against lm-eval's own hf backend, item by item ----

@pytest.fixture(scope="module")
def lm_eval_samples(served, embedded_dir):
    pytest.importorskip("lm_eval")
    return run_lm_eval(served, embedded_dir)


def run_lm_eval(served: Served, embedded_dir: Path) -> dict:
    """Per task, the logged samples of both backends: {"api": {task: [...]}, "hf": {...}}; or the API's error."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    def evaluate(model: str, model_args: dict) -> dict:
        with contextlib.chdir(TASKS):   # the tasks' data_files are relative to their folder
            results = lm_eval.simple_evaluate(model=model, model_args=model_args,
                                              tasks=["rosellm_choice", "rosellm_generate"],
                                              task_manager=TaskManager(include_path=str(TASKS)), log_samples=True,
                                              bootstrap_iters=0, batch_size=1)
        return {task: sorted(samples, key=lambda s: s["doc_id"]) for task, samples in results["samples"].items()}

    samples = {"hf": evaluate("hf", {"pretrained": str(embedded_dir), "dtype": "float32", "device": "cpu"})}
    mark = len(served.recorder.failed)
    try:
        samples["api"] = evaluate("local-completions", {
            "model": MODEL, "base_url": f"{served.url}/completions", "tokenizer": str(embedded_dir),
            "tokenizer_backend": "huggingface", "num_concurrent": 1, "max_retries": 1, "timeout": 120})
    except Exception as e:
        samples["api_error"] = f"{type(e).__name__}: {e}\n\nthe server refused:\n{served.recorder.since(mark)}"
    return samples


def api_samples(lm_eval_samples: dict, task: str) -> list[dict]:
    assert "api_error" not in lm_eval_samples, lm_eval_samples["api_error"]
    return lm_eval_samples["api"][task]


def test_lm_eval_log_likelihoods_equal_the_hf_backend_item_by_item(lm_eval_samples):
    api, hf = api_samples(lm_eval_samples, "rosellm_choice"), lm_eval_samples["hf"]["rosellm_choice"]
    assert [s["doc_id"] for s in api] == [s["doc_id"] for s in hf]
    for a, h in zip(api, hf):
        assert (a["acc"], a["acc_norm"]) == (h["acc"], h["acc_norm"]), f"doc {a['doc_id']}"
        assert_close_lists([ll for ll, _ in a["filtered_resps"]], [ll for ll, _ in h["filtered_resps"]],
                           f"doc {a['doc_id']} log-likelihoods")
        assert [g for _, g in a["filtered_resps"]] == [g for _, g in h["filtered_resps"]], f"doc {a['doc_id']}"


def test_lm_eval_generations_equal_the_hf_backend_item_by_item(lm_eval_samples):
    api, hf = api_samples(lm_eval_samples, "rosellm_generate"), lm_eval_samples["hf"]["rosellm_generate"]
    assert [(s["doc_id"], s["filtered_resps"], s["exact_match"]) for s in api] == \
           [(s["doc_id"], s["filtered_resps"], s["exact_match"]) for s in hf]


# ---- schemathesis: the server's own OpenAPI schema, fuzzed, response-schema conformance on ----

FUZZ_CONTEXT = 32   # a short context bounds every fuzzed request, whatever max_tokens it asks for
# Responses (schema, status, content type, headers), bodies the schema forbids refused (strict types, the limits
# declared), wrong methods answered 405 with Allow; with a key, a request without it refused.
SCHEMATHESIS_CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
                       "response_schema_conformance,response_headers_conformance,negative_data_rejection,"
                       "unsupported_method,allow_header_conformance,missing_required_header")


@pytest.mark.parametrize("api_key", [None, "sk-fuzz"])
def test_schemathesis_finds_no_failure_in_the_openapi_schema(tmp_path, api_key):
    """Its fuzzing phase, a bounded number of examples per operation (its coverage phase, some 800 boundary
    cases, takes minutes here: run `schemathesis run URL/openapi.json` by hand for that)."""
    pytest.importorskip("schemathesis")
    hooks = dict(os.environ, SCHEMATHESIS_HOOKS="clients.schemathesis_hooks", ROSELLM_SERVED_MODEL=MODEL,
                 PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    key = ["--checks", SCHEMATHESIS_CHECKS + ",ignored_auth", "-H", f"Authorization: Bearer {api_key}"] if api_key \
        else ["--checks", SCHEMATHESIS_CHECKS]
    with serving(**ENGINE_KWARGS, max_model_len=FUZZ_CONTEXT, api_key=api_key) as fuzzed:
        start = time.monotonic()
        run = subprocess.run([str(Path(sys.executable).parent / "schemathesis"), "run",
                              f"{fuzzed.origin}/openapi.json", *key, "--phases", "fuzzing",
                              "--max-examples", "25", "--seed", "1", "--workers", "1", "--request-timeout", "60"],
                             capture_output=True, text=True, timeout=400, cwd=tmp_path, env=hooks)
    assert run.returncode == 0, (f"schemathesis failed after {time.monotonic() - start:.0f} s:\n"
                                 f"{run.stdout[-6000:]}\n{run.stderr[-2000:]}")
