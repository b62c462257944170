"""Structured output and tool calling in the server (appendix 13a): request fields onto chapter 13's
StructuredOutputsParams, a 400 naming the field for what cannot be honoured, tool calls read out of the answer.

The server here is built the way `rosellm-edu serve` builds it, with `--max-grammar-bytes` set small. The real
clients (openai, langchain, instructor) are in tests/test_real_clients.py; these tests speak raw HTTP, so that
each checks one field's mapping, and the parsers alone, against references written by hand or by json.loads."""

import json
import re

import httpx
import jsonschema
import pytest

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.entrypoints.cli import build_engine, serve_args
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.protocol import ChatCompletionRequest
from rosellm_edu.entrypoints.openai.server_thread import ServerThread
from rosellm_edu.entrypoints.openai.tool_calls import (array_calls, hermes_calls, required_schema, template_messages,
                                                       text_before_calls)

MODEL = "smollm2-structured"
MAX_GRAMMAR_BYTES = 2048
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
        "required": ["name", "country"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
DATE = {"type": "object", "properties": {"when": {"type": "date"}}}   # a type JSON schema does not have


@pytest.fixture(scope="module")
def url():
    args = serve_args(["--dtype", "float32", "--num-kv-blocks", "256", "--max-num-seqs", "16",
                       "--max-grammar-bytes", str(MAX_GRAMMAR_BYTES)])
    engine = AsyncLLMEngine(build_engine(args))
    thread = ServerThread(build_app(engine, MODEL))
    try:
        yield thread.start()
    finally:
        thread.stop()
        engine.shutdown()


def post(url: str, path: str, **body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": MODEL, "temperature": 0, "max_tokens": 60, **body}, timeout=600)


def chat(url: str, **body) -> httpx.Response:
    return post(url, "/chat/completions", messages=body.pop("messages", QUESTION), **body)


def test_the_cli_flag_sets_the_engines_grammar_limit():
    assert serve_args(["--max-grammar-bytes", "123"]).max_grammar_bytes == 123
    assert serve_args([]).max_grammar_bytes == 65536
    with pytest.raises(SystemExit):
        serve_args(["--max-grammar-bytes", "0"])


# ---- structured output: each field's answer follows what it asked ----

def follows(schema: dict):
    return lambda text: jsonschema.validate(json.loads(text), schema)


def compact(text: str) -> None:
    jsonschema.validate(json.loads(text), CITY)
    assert text == json.dumps(json.loads(text)), text   # no free whitespace: one line, the standard separators


def one_of(*answers: str):
    def check(text: str) -> None:
        assert text in answers, text
    return check


def matches(pattern: str):
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), text
    return check


COPY_ME = "Reply with exactly this JSON object and nothing else: {\"ok\": true}"


@pytest.mark.parametrize("fields, check", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}},
     follows(CITY)),
    ({"response_format": {"type": "json_object"}, "content": COPY_ME}, follows({"type": "object"})),
    ({"structured_outputs": {"json": CITY, "disable_any_whitespace": True}}, compact),
    ({"guided_json": json.dumps(CITY)}, follows(CITY)),
    ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, matches("[0-9]{3}-[a-z]{2}")),
    ({"structured_outputs": {"choice": ["sunny", "rainy"]}}, one_of("sunny", "rainy")),
    ({"guided_grammar": 'root ::= "It is " ("hot" | "cold") "."'}, one_of("It is hot.", "It is cold.")),
])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_each_constraint_field_gives_an_answer_that_follows_it(url, path, fields, check):
    fields = dict(fields)
    content = fields.pop("content", QUESTION[0]["content"])
    prompt = {"messages": [{"role": "user", "content": content}]} if path == "/chat/completions" else {
        "prompt": f"Q: {content}\nA:"}
    r = post(url, path, **{**prompt, **fields, "guided_decoding_backend": "xgrammar"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert choice["finish_reason"] == "stop", (choice, fields)   # the grammar finished, not the token limit
    check(text)


# ---- what cannot be honoured: a 400 naming the field ----

@pytest.mark.parametrize("path, fields, param, words", [
    ("/chat/completions", {"guided_json": "{not json"}, "guided_json", "Failed to parse JSON"),
    ("/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": DATE}}},
     "response_format.json_schema.schema", 'Unsupported type "date"'),
    ("/completions", {"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs.regex", "Lookbehind"),
    ("/completions", {"guided_regex": "a(b"}, "guided_regex", "parenthesis"),
    ("/chat/completions", {"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "undefined_rule"),
    ("/chat/completions", {"guided_json": {"type": "object", "properties": {f"field_{i}": {"type": "string"}
                                                                            for i in range(100)}}},
     "guided_json", f"over max_grammar_bytes={MAX_GRAMMAR_BYTES}"),
    ("/chat/completions", {"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex",
     "one constraint"),
    ("/chat/completions", {"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"},
     "tools", "one constraint"),
    ("/chat/completions", {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern", "not supported"),
    ("/chat/completions", {"structured_outputs": {}}, "structured_outputs", "exactly one of"),
    ("/chat/completions", {"guided_choice": []}, "guided_choice", "at least 1"),
    ("/chat/completions", {"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend",
     "xgrammar"),
    ("/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema"),
    ("/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice", "'get_time'"),
    ("/chat/completions", {"tool_choice": "required"}, "tool_choice", "no tools"),
    ("/chat/completions", {"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name",
     "required"),
    ("/chat/completions", {"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools.1.function.parameters", "type object"),
    ("/chat/completions", {"tools": [WEATHER, WEATHER]}, "tools.1.function.name", "earlier tool"),
    ("/chat/completions", {"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": DATE}}],
                           "tool_choice": "required"}, "tools.1.function.parameters", 'Unsupported type "date"'),
    ("/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": DATE}}],
                           "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools.0.function.parameters", 'Unsupported type "date"'),
    ("/completions", {"tools": [WEATHER]}, "tools", "not supported"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(url, path, fields, param, words):
    prompt = {"messages": QUESTION} if path == "/chat/completions" else {"prompt": "Hi"}
    r = post(url, path, **prompt, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error"), error
    assert error["message"].startswith(param) and words in error["message"], error
    assert "chatcmpl-" not in error["message"] and "cmpl-" not in error["message"]


def test_a_refused_request_leaves_the_server_serving(url):
    assert chat(url, guided_regex="a(b").status_code == 400
    r = chat(url, guided_choice=["yes", "no"])
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")


# ---- tool calls ----

def assert_calls_follow_their_tools(calls: list[dict], tools: list[dict]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


@pytest.mark.parametrize("tool_choice, parallel", [("required", True), ("required", False),
                                                   ({"type": "function", "function": {"name": "get_time"}}, True)])
def test_a_forced_tool_choice_answers_with_calls_that_follow_the_tools_schemas(url, tool_choice, parallel):
    r = chat(url, tools=[WEATHER, CLOCK], tool_choice=tool_choice, parallel_tool_calls=parallel)
    choice = r.json()["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", None), choice
    calls = choice["message"]["tool_calls"]
    assert_calls_follow_their_tools(calls, [WEATHER, CLOCK])
    if isinstance(tool_choice, dict):
        assert [c["function"]["name"] for c in calls] == ["get_time"]
    if not parallel:
        assert len(calls) == 1


def streamed(url: str, **body) -> list[dict]:
    with httpx.stream("POST", f"{url}/chat/completions", timeout=600, json={
            "model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 60, "stream": True, **body}) as r:
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_are_openais_deltas_and_join_to_the_whole_answer(url, tool_choice):
    whole = chat(url, tools=[WEATHER, CLOCK], tool_choice=tool_choice).json()["choices"][0]["message"]["tool_calls"]
    chunks = streamed(url, tools=[WEATHER, CLOCK], tool_choice=tool_choice)
    joined: dict[int, dict] = {}
    for chunk in chunks[1:]:
        for delta in chunk["choices"][0]["delta"].get("tool_calls", []):
            if delta["index"] not in joined:   # a call's first delta: index, id, type, name
                assert delta["index"] == len(joined) and {"id", "type"} <= set(delta) and "name" in delta["function"]
                joined[delta["index"]] = {"name": delta["function"]["name"], "arguments": ""}
            else:
                assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
            joined[delta["index"]]["arguments"] += delta["function"]["arguments"]
        assert "content" not in chunk["choices"][0]["delta"] or chunk is chunks[0]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [joined[i] for i in sorted(joined)] == [c["function"] for c in whole]


def test_auto_with_a_text_answer_is_a_text_answer_equal_to_the_stream(url):
    body = {"tools": [WEATHER], "tool_choice": "auto", "max_tokens": 24}
    choice = chat(url, **body).json()["choices"][0]
    chunks = streamed(url, **body)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    if choice["message"].get("tool_calls"):   # the model may call: then the stream must carry the same calls
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert_calls_follow_their_tools(choice["message"]["tool_calls"], [WEATHER])
    else:
        assert choice["finish_reason"] in ("stop", "length") and text == choice["message"]["content"]


def test_a_round_trip_of_calls_and_results_is_rendered_in_the_hermes_format(url):
    result = '{"sky": "clear", "celsius": 21}'
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}]
    r = chat(url, messages=history, tools=[WEATHER], max_tokens=8)
    assert r.status_code == 200, r.text
    tools = json.dumps(WEATHER)   # as a reader would write the Hermes prompt by hand
    expected = [{"role": "system", "content": HERMES_BY_HAND.replace("TOOLS", tools)},
                {"role": "user", "content": QUESTION[0]["content"]},
                {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                                                 "\n</tool_call>"},
                {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"}]
    tokenized = httpx.post(f"{url.removesuffix('/v1')}/tokenize", json={"model": MODEL, "messages": expected}).json()
    assert r.json()["usage"]["prompt_tokens"] == tokenized["count"]


HERMES_BY_HAND = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
TOOLS
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"""


# ---- the parsers alone ----

def test_template_messages_keep_a_system_message_and_leave_tools_out_for_none():
    system = {"role": "system", "content": "Be brief."}
    body = ChatCompletionRequest(model=MODEL, messages=[system] + QUESTION, tools=[WEATHER])
    out = template_messages(body)
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and out[1:] == QUESTION
    none = ChatCompletionRequest(model=MODEL, messages=[system] + QUESTION, tools=[WEATHER], tool_choice="none")
    assert template_messages(none) == [system] + QUESTION


@pytest.mark.parametrize("text, expected", [
    ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     ("Sure.", [("get_weather", {"city": "Paris"})])),
    ('<tool_call>[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_time", "arguments": {"zone": "B"}}]'
     '</tool_call>', (None, [("get_weather", {"city": "A"}), ("get_time", {"zone": "B"})])),
    ('<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}', (None, [("get_time", {"zone": "UTC"})])),
    ("It is sunny.", None),
    ('<tool_call>{"name": "get_stock", "arguments": {}}</tool_call>', None),      # not a declared tool
    ('<tool_call>{"name": "get_time", "arguments": {"zone": </tool_call>', None),  # not JSON
    ('<tool_call>{"name": "get_time", "arguments": "UTC"}</tool_call>', None),     # arguments not an object
])
def test_hermes_calls_are_read_or_the_answer_is_text(text, expected):
    found = hermes_calls(text, {"get_weather", "get_time"})
    assert (found and (found[0], [(n, json.loads(a)) for n, a in found[1]])) == expected


def test_text_before_calls_holds_back_only_what_may_begin_a_tag():
    assert [text_before_calls(t) for t in ["Hello", "Hello <tool", "Hello <tool_call>{", "a<b"]] == [5, 6, 6, 3]


def test_array_calls_on_every_prefix_grow_towards_the_json_answer():
    answer = json.dumps([{"name": "get_weather", "parameters": {"city": "Pa\"ris}"}},
                         {"name": "get_time", "parameters": {"zone": "[CET]"}}], indent=1)
    reference = [(c["name"], c["parameters"]) for c in json.loads(answer)]
    previous = []
    for end in range(len(answer) + 1):
        calls = array_calls(answer[:end])
        named = [(n, a) for n, a in calls if n is not None]
        assert len(named) >= len(previous)
        for (name, arguments), (old_name, old_arguments) in zip(named, previous):
            assert name == old_name and arguments.startswith(old_arguments)   # a stream only ever adds
        previous = named
    assert [(n, json.loads(a)) for n, a in previous] == reference


def test_required_schema_is_a_list_of_calls_with_defs_at_the_root():
    item = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Place"}}, "required": ["at"],
            "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    tools = ChatCompletionRequest(model=MODEL, messages=QUESTION, tools=[
        WEATHER, {"type": "function", "function": {"name": "go", "parameters": item}}]).tools
    schema = required_schema(tools, parallel=False)
    assert schema["maxItems"] == 1 and "maxItems" not in required_schema(tools, parallel=True)
    jsonschema.validate([{"name": "go", "parameters": {"at": {"city": "Oslo"}}}], schema)
    for wrong in [[], [{"name": "go", "parameters": {"at": {}}}], [{"name": "fly", "parameters": {}}],
                  [{"name": "get_weather", "parameters": {"city": "A"}}] * 2]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
