"""The OpenAI-compatible server, driven by the official openai client on loopback, against offline LLM.generate."""

import asyncio
import json
import time

import httpx
import openai
import pytest

from rosellm_edu import LLM, SamplingParams
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.server_thread import ServerThread

MODEL = "smollm2-test"
ENGINE_KWARGS = dict(dtype="float32", num_kv_blocks=512, block_size=16, max_num_seqs=64)
COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "usage"}
COMPLETION_CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason"}


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLMEngine(LLMEngine(**ENGINE_KWARGS))
    thread = ServerThread(build_app(engine, MODEL))
    url = thread.start()
    yield url, engine
    thread.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0], api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline():
    return LLM(**ENGINE_KWARGS)


def offline_output(offline, prompt, **params):
    return offline.generate([prompt], SamplingParams(**params), use_tqdm=False)[0].outputs[0]


def chat_ids(offline, messages) -> dict:
    ids = offline.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"]
    return {"prompt_token_ids": ids}


def wait_until_all_blocks_free(engine: AsyncLLMEngine, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.engine.kv_cache_stats()
        if stats["free_blocks"] == stats["total_blocks"] and not engine.engine.has_unfinished_requests():
            return stats
        time.sleep(0.05)
    raise AssertionError(f"KV blocks still in use after {timeout} s: {engine.engine.kv_cache_stats()}")


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server[0].removesuffix("/v1") + "/health").status_code == 200


def test_greedy_completion_equals_offline_generate(client, offline):
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    ref = offline_output(offline, prompt, temperature=0, max_tokens=12)
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.prompt_tokens == len(offline.get_tokenizer()(prompt).input_ids)


def test_token_id_prompt_equals_offline_generate(client, offline):
    ids = [504, 3458, 282, 4649, 314]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    ref = offline_output(offline, {"prompt_token_ids": ids}, temperature=0, max_tokens=6, ignore_eos=True)
    assert (r.choices[0].text, r.usage.completion_tokens) == (ref.text, 6)


def test_streamed_completion_joins_to_the_offline_text_and_ends_with_done(server, offline):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "stream": True}
    with httpx.stream("POST", server[0] + "/completions", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and set(c) == COMPLETION_KEYS - {"usage"} for c in chunks)
    assert all(set(c["choices"][0]) == COMPLETION_CHOICE_KEYS for c in chunks)
    ref = offline_output(offline, "Once upon a time", temperature=0, max_tokens=10)
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [ref.finish_reason]


def test_stream_usage_chunk_when_asked(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_plain_and_streamed_equal_offline_generate_on_the_chat_template(client, offline):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    ref = offline_output(offline, chat_ids(offline, messages), temperature=0, max_tokens=16)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert (r.choices[0].message.role, r.choices[0].message.content) == ("assistant", ref.text)
    assert r.choices[0].finish_reason == ref.finish_reason
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_seeded_sampling_parameters_and_stop_map_onto_sampling_params(client, offline):
    prompt = "My favourite food is"
    params = dict(temperature=0.9, top_p=0.9, seed=7, max_tokens=12, stop=["."])
    r = client.completions.create(model=MODEL, prompt=prompt, extra_body={"top_k": 40}, **params)
    ref = offline_output(offline, prompt, top_k=40, **params)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (ref.text, ref.finish_reason)
    assert "." not in r.choices[0].text


def test_responses_have_exactly_openais_keys_when_no_extra_is_asked(server):
    r = httpx.post(server[0] + "/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60)
    body = r.json()
    assert set(body) == COMPLETION_KEYS and set(body["choices"][0]) == COMPLETION_CHOICE_KEYS
    r = httpx.post(server[0] + "/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert set(body["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert set(body["choices"][0]["message"]) == {"role", "content"}


def test_sampling_mask_full_and_streamed_match_offline_and_hold_the_tokens(client, offline):
    prompt, n = "Write a word:", 8
    extra = {"top_k": 20, "return_sampling_mask": True, "ignore_eos": True}
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=1.0, top_p=0.8,
                                     seed=3, extra_body=extra).model_dump()["choices"][0]
    ref = offline_output(offline, prompt, max_tokens=n, temperature=1.0, top_p=0.8, top_k=20, seed=3,
                         ignore_eos=True, return_sampling_mask=True)
    assert len(full["sampling_mask"]) == len(full["sampling_logz"]) == n
    assert full["sampling_mask"] == ref.sampling_mask
    assert full["sampling_logz"] == pytest.approx(ref.sampling_logz)
    assert all(token in mask for token, mask in zip(ref.token_ids, full["sampling_mask"]))
    chunks = [c.model_dump()["choices"][0] for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n, temperature=1.0, top_p=0.8, seed=3, stream=True, extra_body=extra)]
    assert [m for c in chunks for m in c["sampling_mask"]] == full["sampling_mask"]
    assert all(len(c["sampling_mask"]) == len(c["sampling_logz"]) for c in chunks)


def test_sampling_mask_in_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0.7, extra_body={"top_k": 5, "return_sampling_mask": True,
                                                                    "ignore_eos": True})
    choice = r.model_dump()["choices"][0]
    assert len(choice["sampling_mask"]) == 4 and all(len(m) <= 5 for m in choice["sampling_mask"])


BAD_REQUESTS = [
    ("/completions", {"model": "no-such-model", "prompt": "x"}, 404, "model"),
    ("/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ("/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/completions", {"model": MODEL, "prompt": "x", "seed": 2**64}, 400, "seed"),
    ("/completions", {"model": MODEL, "prompt": ["a", "x " * 9000]}, 400, "prompt"),
    ("/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
    ("/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/completions", {"model": MODEL, "prompt": "x " * 9000}, 400, "prompt"),
    ("/completions", {"model": MODEL, "prompt": [10**9]}, 400, "prompt"),
    ("/completions", {"model": MODEL}, 400, "prompt"),
    ("/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
     400, "max_tokens"),
    ("/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    r = httpx.post(server[0] + path, json=body, timeout=60)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_malformed_json_is_a_400_and_the_server_keeps_serving(server, client):
    r = httpx.post(server[0] + "/completions", content=b'{"model": ', timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", top_p=7)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text


def test_disconnect_mid_stream_aborts_and_frees_kv_blocks(server):
    url, engine = server
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        stats = engine.engine.kv_cache_stats()
        assert stats["free_blocks"] < stats["total_blocks"]
    wait_until_all_blocks_free(engine, timeout=10)   # 2000 tokens would take far longer than 10 s


def test_disconnect_while_waiting_for_a_full_response_aborts(server):
    url, engine = server
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 2000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    wait_until_all_blocks_free(engine, timeout=10)


async def stream_text(client: openai.AsyncOpenAI, prompt: str, max_tokens: int, leave_after: int | None):
    """The joined text of one streamed greedy completion; None if this client leaves after a few chunks."""
    stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    text = []
    async for i, chunk in aenumerate(stream):
        if i == leave_after:
            await stream.close()
            return None
        text.append(chunk.choices[0].text)
    return "".join(text)


async def aenumerate(iterable):
    i = 0
    async for item in iterable:
        yield i, item
        i += 1


def test_64_concurrent_streams_some_leaving_early_are_whole_and_free_every_block(server, offline):
    url, engine = server
    words = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()
    prompts = [" ".join(words[i % 5:(i % 5) + 2 + i % 11]) + f" {i}" for i in range(64)]
    max_tokens = [2 + (i * 7) % 11 for i in range(64)]
    leave_after = [1 if i % 4 == 3 else None for i in range(64)]

    async def run():
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120) as client:
            bad = client.completions.create(model=MODEL, prompt="x", top_p=3.0)
            results = await asyncio.gather(*[stream_text(client, p, n, leave) for p, n, leave
                                             in zip(prompts, max_tokens, leave_after)], bad, return_exceptions=True)
            return results[:-1], results[-1]

    texts, bad = asyncio.run(asyncio.wait_for(run(), timeout=300))
    assert isinstance(bad, openai.BadRequestError)
    refs = offline.generate(prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                                      for n in max_tokens], use_tqdm=False)
    for text, leave, ref in zip(texts, leave_after, refs):
        assert text == (None if leave is not None else ref.outputs[0].text)
    wait_until_all_blocks_free(engine)


def test_bench_client_times_every_token_of_the_workload(server):
    from rosellm_edu.benchmarks.client import time_requests

    requests = [([100 + i, 200 + i, 300 + i], 2 + i) for i in range(4)]
    arrivals = [0.0, 0.0, 0.2, 0.4]
    times, duration, model, mismatches = asyncio.run(time_requests(server[0], requests, arrivals))
    assert (model, mismatches) == (MODEL, 0)
    assert [len(t.token_times) for t in times] == [n for _, n in requests]
    assert all(t.arrival == a and a < t.token_times[0] <= t.token_times[-1] <= duration
               for t, a in zip(times, arrivals))


def test_cli_serves_the_embedded_model_on_loopback():
    import socket
    import subprocess
    import sys

    from rosellm_edu.model_loader import EMBEDDED_NAME

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rosellm_edu.entrypoints.cli", "serve", "--port", str(port),
                             "--num-kv-blocks", "64"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the server did not come up in 120 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == [EMBEDDED_NAME]
        r = client.completions.create(model=EMBEDDED_NAME, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
    finally:
        proc.terminate()
        proc.wait(30)


def test_cli_without_a_command_prints_its_usage():
    from rosellm_edu.entrypoints.cli import main

    with pytest.raises(SystemExit, match="rosellm-edu serve"):
        main([])


def test_a_failing_engine_step_fails_its_requests_not_the_server(server, client):
    url, engine = server

    def failing_forward(batch):   # inside the step, after the scheduler took the request into the batch
        del engine.engine.forward   # fail once, then step as before
        raise RuntimeError("simulated fault")

    engine.engine.forward = failing_forward
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/completions", json=body, timeout=60) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "simulated fault" in error["message"]
    wait_until_all_blocks_free(engine)

    engine.engine.forward = failing_forward
    r = httpx.post(url + "/completions", json={**body, "stream": False}, timeout=60)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
    wait_until_all_blocks_free(engine)


def test_bench_command_drives_the_server_by_url_with_its_sampling_settings(server, tmp_path, monkeypatch):
    from rosellm_edu.benchmarks.mixed import main

    url, engine = server
    received = []

    async def recording_add_request(request_id, prompt, params, priority=0):
        received.append(params)
        return await AsyncLLMEngine.add_request(engine, request_id, prompt, params, priority)

    monkeypatch.setattr(engine, "add_request", recording_add_request)
    out = tmp_path / "bench.json"
    main(["--engines", "openai", "--url", url, "--workload", "equal", "--num-requests", "1",
          "--temperature", "0.8", "--top-k", "20", "--json", str(out)])
    result = json.loads(out.read_text())["results"][0]
    assert (result["engine"], result["model"], result["requests"]) == ("openai", MODEL, 1)
    assert result["completion_tokens"] == 64 and result["token_count_mismatches"] == 0
    settings = [(p.temperature, p.top_k, p.top_p, p.max_tokens, p.ignore_eos) for p in received]
    assert settings == [(0.8, 20, 1.0, 64, True)]
    assert result["dtype"] == "server's own"   # not the --dtypes default: a server picks its own
