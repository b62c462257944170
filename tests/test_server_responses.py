"""/v1/responses, the Responses API's text path, driven over HTTP and checked against the offline engine on the chat
template and against /v1/chat/completions for the same messages. The real clients (the openai client's
responses.create and responses.stream, langchain's use_responses_api) are in tests/test_real_clients.py."""

import json
import time

import httpx
import pytest

from rosellm_edu import SamplingParams
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.server_thread import ServerThread

from test_server import ENGINE_KWARGS, MODEL, offline, server  # noqa: F401 (fixtures)

QUESTION = "What is the capital of France?"
RESPONSE_KEYS = {"id", "object", "created_at", "status", "model", "output", "usage", "incomplete_details", "error",
                 "instructions", "max_output_tokens", "temperature", "top_p", "metadata", "user",
                 "previous_response_id", "store", "parallel_tool_calls", "tool_choice", "tools"}
OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def offline_chat(offline, messages: list[dict], max_tokens: int):
    """The offline engine's greedy answer to these messages through the chat template: (output, prompt length)."""
    ids = offline.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"]
    out = offline.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=max_tokens),
                           use_tqdm=False)[0].outputs[0]
    return out, len(ids)


def respond(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/responses", json={"model": MODEL, **body}, timeout=120)


def streamed_events(url: str, **body) -> list[tuple[str, dict]]:
    """(the `event:` line's name, the `data:` line's JSON) of every event of a streamed response."""
    with httpx.stream("POST", f"{url}/responses", json={"model": MODEL, "stream": True, **body}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        blocks = r.read().decode().strip().split("\n\n")
    events = []
    for block in blocks:
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def output_text(response: dict) -> str:
    [item] = response["output"]
    assert (item["type"], item["role"], item["id"][:4]) == ("message", "assistant", "msg_")
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    return part["text"]


def test_the_answer_is_the_offline_engines_on_the_chat_template_and_chats(server, offline):
    url, _ = server
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION}]
    ref, prompt_len = offline_chat(offline, messages, 12)
    r = respond(url, instructions="You are terse.", input=QUESTION, max_output_tokens=12, temperature=0,
                metadata={"run": "a"}, user="ann")
    body = r.json()
    assert r.status_code == 200 and set(body) == RESPONSE_KEYS
    assert (body["object"], body["id"][:5], body["model"]) == ("response", "resp_", MODEL)
    assert output_text(body) == ref.text
    assert (body["instructions"], body["max_output_tokens"], body["metadata"], body["user"]) == \
           ("You are terse.", 12, {"run": "a"}, "ann")
    assert body["usage"] == {"input_tokens": prompt_len, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": len(ref.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": prompt_len + len(ref.token_ids)}
    assert body["status"] == ("incomplete" if ref.finish_reason == "length" else "completed")
    chat = httpx.post(f"{url}/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}).json()
    assert chat["choices"][0]["message"]["content"] == output_text(body)


@pytest.mark.parametrize("given", [
    {"input": [{"role": "user", "content": QUESTION}]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]},
    {"input": [{"role": "developer", "content": "You are terse."}, {"role": "user", "content": QUESTION}]},
])
def test_input_as_messages_or_parts_means_what_the_string_means(server, given):
    """A string is one user message; input_text parts join as chat's text parts do; developer is system."""
    url, _ = server
    instructions = {} if given["input"][0]["role"] == "developer" else {"instructions": "You are terse."}
    plain = respond(url, instructions="You are terse.", input=QUESTION, max_output_tokens=8, temperature=0).json()
    other = respond(url, **instructions, **given, max_output_tokens=8, temperature=0).json()
    assert output_text(other) == output_text(plain)
    assert other["usage"]["input_tokens"] == plain["usage"]["input_tokens"]


def test_a_history_with_an_earlier_answer_is_the_chat_conversation(server, offline):
    """What the openai client and langchain send back as history: the assistant's output item, with its id."""
    url, _ = server
    history = [{"role": "user", "content": "Name a colour."},
               {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
               {"role": "user", "content": "Another one."}]
    ref, _ = offline_chat(offline, [{"role": m["role"], "content": "Blue." if m["role"] == "assistant"
                                     else m["content"]} for m in history], 8)
    assert output_text(respond(url, input=history, max_output_tokens=8, temperature=0).json()) == ref.text


def test_streamed_events_are_typed_numbered_and_join_to_the_whole_response(server):
    url, _ = server
    whole = respond(url, input=QUESTION, max_output_tokens=12, temperature=0).json()
    events = streamed_events(url, input=QUESTION, max_output_tokens=12, temperature=0)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = [data for _, data in events if data["type"] == "response.output_text.delta"]
    assert names == OPENING + ["response.output_text.delta"] * len(deltas) + CLOSING + [f"response.{whole['status']}"]
    assert len(deltas) > 1 and all(d["delta"] for d in deltas)   # one per step that added text
    item_id = events[2][1]["item"]["id"]
    assert {(d["item_id"], d["output_index"], d["content_index"]) for d in deltas} == {(item_id, 0, 0)}
    text = "".join(d["delta"] for d in deltas)
    final = events[-1][1]["response"]
    assert text == events[-4][1]["text"] == events[-3][1]["part"]["text"] == output_text(final) == output_text(whole)
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    assert final["id"] == events[0][1]["response"]["id"] and final["output"][0]["id"] == item_id
    assert final["usage"] == whole["usage"]


def test_max_output_tokens_cuts_the_text_and_the_response_is_incomplete(server, offline):
    url, _ = server
    ref, _ = offline_chat(offline, [{"role": "user", "content": QUESTION}], 3)
    body = respond(url, input=QUESTION, max_output_tokens=3, temperature=0).json()
    assert (body["status"], body["incomplete_details"], body["output"][0]["status"]) == \
           ("incomplete", {"reason": "max_output_tokens"}, "incomplete")
    assert (output_text(body), body["usage"]["output_tokens"]) == (ref.text, 3)
    events = streamed_events(url, input=QUESTION, max_output_tokens=3, temperature=0)
    assert events[-1][0] == "response.incomplete" and events[-1][1]["response"]["status"] == "incomplete"


@pytest.mark.parametrize("field, value", [
    ("store", True), ("background", True), ("previous_response_id", "resp_123"), ("conversation", "conv_1"),
    ("tools", [{"type": "web_search"}]), ("tool_choice", "required"), ("reasoning", {"effort": "high"}),
    ("include", ["message.output_text.logprobs"]), ("top_logprobs", 2), ("truncation", "auto"),
    ("text", {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}),
    ("prompt_cache_key", "k"),
])
def test_what_is_not_offered_is_a_400_naming_the_field(server, field, value):
    r = respond(server[0], input=QUESTION, max_output_tokens=4, **{field: value})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["type"]) == (400, field, "invalid_request_error")
    assert error["message"].startswith(f"{field}: not supported by this server")


def test_the_values_that_ask_for_nothing_are_accepted(server):
    """What clients send by default: store false, no tools, tool_choice auto, plain text."""
    r = respond(server[0], input=QUESTION, max_output_tokens=4, store=False, background=False, tools=[],
                tool_choice="auto", parallel_tool_calls=True, text={"format": {"type": "text"}}, include=[],
                truncation="disabled", reasoning=None)
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete")


@pytest.mark.parametrize("body, status, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}, 400,
     "input.messages.0.content"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]}, 400, "input.messages.0.type"),
    ({"input": [{"role": "tool", "content": "4"}]}, 400, "input.messages.0.role"),
    ({"input": ""}, 400, "input.text"),
    ({"input": []}, 400, "input.messages"),
    ({"input": QUESTION, "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": QUESTION, "max_output_tokens": 10**6}, 400, "max_output_tokens"),
    ({"input": QUESTION, "temperature": -1}, 400, "temperature"),
    ({"input": QUESTION, "model": "gpt-4o"}, 404, "model"),
    ({"input": "a" * 1_000_001}, 400, "input"),            # ServerLimits.max_prompt_chars, before tokenizing
    ({"input": QUESTION, "priority": 1}, 400, "priority"),  # this server schedules first come, first served
    ({"input": "a\ud800b"}, 400, "input"),                 # a lone surrogate is not text
])
def test_invalid_requests_are_refused_naming_the_field(server, body, status, param):
    r = httpx.post(f"{server[0]}/responses", content=json.dumps({"model": MODEL, **body}), timeout=60,
                   headers={"content-type": "application/json"})   # json.dumps escapes a lone surrogate, as JS does
    assert (r.status_code, r.json()["error"]["param"]) == (status, param), r.json()


def test_a_client_that_leaves_mid_stream_aborts_its_request(server):
    url, engine = server
    body = {"model": MODEL, "input": "Count from one to one thousand in words.", "max_output_tokens": 400,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/responses", json=body, timeout=120) as r:
        lines = r.iter_lines()
        while "response.output_text.delta" not in next(lines):
            pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = engine.engine.kv_cache_stats()
        if not engine.engine.has_unfinished_requests() and stats["free_blocks"] == stats["total_blocks"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the request still runs, or holds blocks: {engine.engine.kv_cache_stats()}")


def test_openapi_declares_the_route_its_fields_and_its_errors(server):
    schema = httpx.get(server[0].removesuffix("/v1") + "/openapi.json").json()
    operation = schema["paths"]["/v1/responses"]["post"]
    assert {"200", "400", "404"} <= set(operation["responses"]) and "422" not in operation["responses"]
    fields = schema["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert {"input", "instructions", "max_output_tokens", "store", "tools", "previous_response_id"} <= set(fields)


def test_a_stream_whose_engine_fails_ends_with_response_failed():
    """The stream is already open (200) when the engine breaks: its last event says so, in the Responses shape."""
    llm_engine = LLMEngine(dtype="float32", num_kv_blocks=64, block_size=16, max_num_seqs=1)
    engine = AsyncLLMEngine(llm_engine)
    thread = ServerThread(build_app(engine, MODEL))
    url = thread.start()
    body = {"model": MODEL, "input": "Count from one to one thousand in words.", "max_output_tokens": 300,
            "temperature": 0, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/responses", json=body, timeout=120) as r:
            lines = r.iter_lines()
            while "response.output_text.delta" not in next(lines):
                pass
            llm_engine.forward = lambda batch: 1 / 0   # every step fails from now on
            data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
        failed = data[-1]
        assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
        assert failed["response"]["error"]["code"] == "server_error"
        assert "ZeroDivisionError" in failed["response"]["error"]["message"]
        numbers = [d["sequence_number"] for d in data]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    finally:
        thread.stop()
        engine.shutdown()
