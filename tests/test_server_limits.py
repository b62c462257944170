"""The server's key, limits and refusals: each limit has a flag, a default, a 400 that names the field and the flag,
and its place in /openapi.json; a malformed request is a 400 naming the field on every route, never a 500; the 500
that remains closes its connection cleanly. Driven over loopback with httpx and the openai client."""

import asyncio
import json
import threading

import httpx
import openai
import pytest

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.entrypoints.cli import serve_args, server_limits
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.limits import ServerLimits
from rosellm_edu.entrypoints.openai.serving_engine import LARGE_PROMPT_CHARS
from rosellm_edu.entrypoints.openai.server_thread import ServerThread

MODEL = "smollm2-test"
KEY = "sk-test-key"
LIMITS = ServerLimits(max_prompt_chars=2000, max_n=4, max_logit_bias=8)
CUT = "a\ud800b"   # a lone UTF-16 surrogate: valid JSON, not text


@pytest.fixture(scope="module")
def engines():
    """One engine scheduling first come first served, one by priority."""
    fcfs = AsyncLLMEngine(LLMEngine(dtype="float32", num_kv_blocks=256, block_size=16))
    by_priority = AsyncLLMEngine(LLMEngine(dtype="float32", num_kv_blocks=256, block_size=16,
                                           scheduling_policy="priority"))
    yield fcfs, by_priority
    fcfs.shutdown()
    by_priority.shutdown()


def serve(engine, **kw):
    app = build_app(engine, MODEL, **kw)
    thread = ServerThread(app)
    return thread, thread.start().removesuffix("/v1"), app


@pytest.fixture(scope="module")
def limited(engines):
    thread, origin, app = serve(engines[0], limits=LIMITS)
    yield origin, app, engines[0]
    thread.stop()


@pytest.fixture(scope="module")
def keyed(engines):
    thread, origin, _ = serve(engines[0], api_key=KEY)
    yield origin
    thread.stop()


def post(origin: str, path: str, body: dict, **kw) -> httpx.Response:
    """json.dumps escapes a lone surrogate (\\ud800), as a JavaScript client's JSON.stringify does."""
    return httpx.post(origin + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      **{"timeout": 120, **kw})


def refusal(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ---- the key

def test_a_key_guards_every_v1_route_and_nothing_else(keyed):
    for headers in [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}]:
        r = httpx.get(f"{keyed}/v1/models", headers=headers)
        error = refusal(r, 401)
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        assert KEY not in r.text and r.headers["www-authenticate"] == "Bearer"
    error = refusal(post(keyed, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1}), 401)
    assert "--api-key" in error["message"]
    client = openai.OpenAI(base_url=f"{keyed}/v1", api_key=KEY, max_retries=0, timeout=120)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed}/v1", api_key="sk-wrong", max_retries=0).models.list()
    # vLLM's rule: what is outside /v1 stays open
    assert httpx.get(f"{keyed}/health").status_code == 200
    assert httpx.get(f"{keyed}/metrics").status_code == 200
    assert post(keyed, "/tokenize", {"prompt": "Hi"}).status_code == 200
    schema = httpx.get(f"{keyed}/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert "401" in schema["paths"]["/v1/completions"]["post"]["responses"]
    assert "security" not in schema["paths"]["/tokenize"]["post"]


def test_the_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv("ROSELLM_API_KEY", raising=False)
    assert serve_args([]).api_key is None
    monkeypatch.setenv("ROSELLM_API_KEY", "from-env")
    assert serve_args([]).api_key == "from-env"
    assert serve_args(["--api-key", "from-flag"]).api_key == "from-flag"


# ---- the limits

def test_every_limit_has_a_flag_and_a_default():
    args = serve_args(["--max-prompt-chars", "10", "--max-n", "2", "--max-logit-bias", "3",
                       "--tokenizer-workers", "3", "--max-request-body-bytes", "100", "--max-step-seconds", "5"])
    assert server_limits(args) == ServerLimits(max_body_bytes=100, max_prompt_chars=10, max_n=2, max_logit_bias=3,
                                               tokenizer_workers=3, max_step_seconds=5.0)
    assert server_limits(serve_args([])) == ServerLimits()
    with pytest.raises(ValueError, match="max_n"):
        ServerLimits(max_n=0)


def test_the_stream_buffer_has_a_flag():
    assert serve_args([]).max_buffered_outputs == 1024
    assert serve_args(["--max-buffered-outputs", "8"]).max_buffered_outputs == 8
    with pytest.raises(SystemExit):
        serve_args(["--max-buffered-outputs", "0"])


@pytest.mark.parametrize("path,body,param,flag", [
    ("/v1/completions", {"prompt": "Hi " * 700}, "prompt", "--max-prompt-chars"),
    ("/v1/completions", {"prompt": ["Hi " * 400, "Ho " * 400]}, "prompt", "--max-prompt-chars"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi " * 700}]}, "messages",
     "--max-prompt-chars"),
    ("/tokenize", {"prompt": "Hi " * 700}, "prompt", "--max-prompt-chars"),
    ("/v1/completions", {"prompt": "Hi", "n": 5}, "n", "--max-n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 5}, "n", "--max-n"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {str(t): -1.0 for t in range(9)}}, "logit_bias",
     "--max-logit-bias"),
])
def test_a_request_over_a_limit_is_a_400_naming_the_field_and_the_flag(limited, monkeypatch, path, body, param,
                                                                        flag):
    origin, app, _ = limited
    tokenized = []
    run = app.state.lanes.run
    monkeypatch.setattr(app.state.lanes, "run", lambda *a: tokenized.append(a) or run(*a))
    error = refusal(post(origin, path, {"model": MODEL, **body}))
    assert error["param"] == param and flag in error["message"], error
    assert not tokenized   # refused before any tokenizing


def test_requests_at_the_limits_are_served(limited):
    origin = limited[0]
    r = post(origin, "/v1/completions", {"model": MODEL, "prompt": "x" * LIMITS.max_prompt_chars, "max_tokens": 1,
                                         "n": LIMITS.max_n, "logit_bias": {str(t): 1.0 for t in range(8)}})
    assert r.status_code == 200 and len(r.json()["choices"]) == LIMITS.max_n


def test_priority_is_refused_under_fcfs_and_passed_to_a_priority_engine(limited, engines, monkeypatch):
    error = refusal(post(limited[0], "/v1/completions", {"model": MODEL, "prompt": "Hi", "priority": 1}))
    assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
    assert post(limited[0], "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1,
                                                "priority": 0}).status_code == 200
    engine = engines[1]
    seen = []

    async def recording_add_request(request_id, prompt, params, priority=0):
        seen.append(priority)
        return await AsyncLLMEngine.add_request(engine, request_id, prompt, params, priority)

    thread, origin, _ = serve(engine)
    try:
        monkeypatch.setattr(engine, "add_request", recording_add_request)
        for path, body in [("/v1/completions", {"prompt": ["Hi", "Ho"]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})]:
            r = post(origin, path, {"model": MODEL, "max_tokens": 1, "priority": -3, **body})
            assert r.status_code == 200, r.text
    finally:
        thread.stop()
    assert seen == [-3, -3, -3]


def test_the_schema_states_the_limits_the_server_applies(limited):
    schemas = httpx.get(f"{limited[0]}/openapi.json").json()["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"]["properties"], schemas["ChatCompletionRequest"]["properties"]
    for fields in (completion, chat):
        assert fields["n"]["minimum"] == 1 and fields["n"]["maximum"] == LIMITS.max_n
        assert [m["maxProperties"] for m in fields["logit_bias"]["anyOf"] if m["type"] == "object"] == [8]
    assert completion["max_tokens"]["anyOf"][0]["minimum"] == 1
    assert chat["max_tokens"]["anyOf"][0]["minimum"] == 1
    assert chat["max_completion_tokens"]["anyOf"][0]["minimum"] == 1
    assert chat["messages"]["minItems"] == 1
    prompt = completion["prompt"]["anyOf"]
    assert [m.get("minLength", m.get("minItems")) for m in prompt] == [1, 1, 1, 1]   # prompt: [] is refused
    assert prompt[0]["maxLength"] == prompt[2]["items"]["maxLength"] == LIMITS.max_prompt_chars
    assert prompt[3]["items"]["minItems"] == 1


def test_a_small_request_is_tokenized_while_the_large_lane_is_busy(engines):
    thread, origin, app = serve(engines[0])
    release = threading.Event()
    busy = app.state.lanes.large.submit(release.wait, 60)   # the large lane's one thread, held
    try:
        r = post(origin, "/tokenize", {"prompt": "The capital of France is"}, timeout=20)
        assert r.status_code == 200 and r.json()["count"] > 0
        with pytest.raises(httpx.ReadTimeout):   # a large text waits in its own lane
            post(origin, "/tokenize", {"prompt": "x" * (LARGE_PROMPT_CHARS + 1)}, timeout=1)
    finally:
        release.set()
        busy.result()
        thread.stop()


def test_each_tokenizer_thread_has_its_own_tokenizer(limited):
    lanes = limited[1].state.lanes

    async def tokenizers():
        return await asyncio.gather(*[lanes.run(chars, lambda tok: id(tok)) for chars in [1] * 8 + [10**6]])

    assert len(set(asyncio.run(tokenizers()))) >= 2


# ---- 400, not 500

@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"model": MODEL, "prompt": CUT}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["ok", CUT]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "stop": [CUT]}, "stop"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": CUT}]}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": CUT}]}]}, "messages"),
    ("/tokenize", {"prompt": CUT}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": CUT}]}, "messages"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(limited, path, body, param):
    error = refusal(post(limited[0], path, body))
    assert error["param"] == param and "surrogate" in error["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "Hi", "echo": 0}, "echo"),
    ("/v1/completions", {"prompt": "Hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 1.5}, "max_tokens"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, "prompt.0"),
    ("/v1/completions", {"prompt": [False]}, "prompt.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True,
                              "top_logprobs": False}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/detokenize", {"tokens": [False]}, "tokens.0"),
])
def test_types_are_strict(limited, path, body, param):
    error = refusal(post(limited[0], path, {"model": MODEL, **body}))
    assert error["param"] == param, error


def test_a_float_field_still_takes_an_integer(limited):
    r = post(limited[0], "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                                             "top_p": 1})
    assert r.status_code == 200, r.text


def test_a_500_closes_its_connection_and_the_client_goes_on(limited, monkeypatch):
    origin, _, engine = limited

    async def broken(*args, **kw):
        raise RuntimeError("simulated bug")

    with httpx.Client(base_url=origin, timeout=120) as http:
        monkeypatch.setattr(engine, "add_request", broken)
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1})
        assert refusal(r, 500)["type"] == "server_error" and "simulated" not in r.text
        assert r.headers["connection"] == "close"
        monkeypatch.undo()
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_a_wrong_method_is_a_405_with_allow(limited):
    for method, path, allow in [("TRACE", "/v1/completions", "POST"), ("DELETE", "/v1/models", "GET"),
                                ("PUT", "/health", "GET")]:
        r = httpx.request(method, limited[0] + path)
        refusal(r, 405)
        assert r.headers["allow"] == allow


def test_one_model_by_its_id(limited):
    client = openai.OpenAI(base_url=f"{limited[0]}/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    error = refusal(httpx.get(f"{limited[0]}/v1/models/org/gpt-4"), 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")
