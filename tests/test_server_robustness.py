"""The engine loop under faults: idempotent aborts, a failing step, a failing tokenizer, a loop that stops, big bodies."""

import asyncio
import json
import threading
import time

import httpx
import pytest

from rosellm_edu import SamplingParams
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError, RequestFailedError
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.limits import ServerLimits
from rosellm_edu.entrypoints.openai.server_thread import ServerThread

MODEL = "smollm2-test"
ENGINE_KWARGS = dict(dtype="float32", num_kv_blocks=256, block_size=16)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def llm_engine():
    return LLMEngine(max_num_seqs=1, **ENGINE_KWARGS)   # one running request: a second one waits


@pytest.fixture
def async_engine(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    yield engine
    engine.shutdown()
    for seq in list(llm_engine.scheduler.running) + list(llm_engine.scheduler.waiting):
        llm_engine.abort_request(seq.request_id)


async def first_output(stream):
    return await stream.__anext__()


def test_abort_ignores_unknown_and_finished_ids_and_is_awaitable(async_engine):
    async def run():
        await async_engine.abort("never-added")
        await async_engine.abort(["never-added", "nor-this"])
        outs = [out async for out in async_engine.generate("Hi", SamplingParams(temperature=0, max_tokens=2), "a")]
        await async_engine.abort("a")   # finished already
        stream = await async_engine.add_request("b", "Hello", LONG)
        await first_output(stream)
        await async_engine.abort(["b", "a", "zzz"])
        return outs

    outs = asyncio.run(asyncio.wait_for(run(), 120))
    assert outs[-1].finished and sum(len(o.outputs[0].token_ids) for o in outs) == 2
    deadline = time.monotonic() + 10
    while async_engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not async_engine.engine.has_unfinished_requests() and async_engine.errored is None


def test_a_failing_step_fails_the_request_it_ran_and_the_waiting_one_goes_on(async_engine, llm_engine):
    async def run():
        running = await async_engine.add_request("running", "The history of Rome", LONG)
        await first_output(running)   # "running" is in the batch now; "waiting" cannot join (max_num_seqs=1)
        waiting = await async_engine.add_request("waiting", "Hi", SamplingParams(temperature=0, max_tokens=3))

        def failing_forward(batch):
            del llm_engine.forward   # fail once
            raise RuntimeError("simulated fault")

        llm_engine.forward = failing_forward
        with pytest.raises(RequestFailedError, match="simulated fault"):
            async for _ in running:
                pass
        return [out async for out in waiting]

    outs = asyncio.run(asyncio.wait_for(run(), 120))
    assert outs[-1].finished and sum(len(o.outputs[0].token_ids) for o in outs) == 3
    assert async_engine.errored is None


def test_a_tokenizer_that_fails_refuses_that_request_only(async_engine, llm_engine, monkeypatch):
    real = llm_engine.tokenizer.__class__.__call__

    def tokenizer_call(self, text, *args, **kwargs):
        if text == "poison":
            raise RuntimeError("simulated tokenizer fault")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(llm_engine.tokenizer.__class__, "__call__", tokenizer_call)

    async def run():
        with pytest.raises(RuntimeError, match="simulated tokenizer fault"):
            await async_engine.add_request("bad", "poison", LONG)
        return [out async for out in async_engine.generate("Hi", SamplingParams(temperature=0, max_tokens=2), "ok")]

    assert asyncio.run(asyncio.wait_for(run(), 120))[-1].finished


def test_an_engine_that_keeps_failing_is_dead_every_open_stream_hears_it_and_health_says_503(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    thread = ServerThread(build_app(engine, MODEL))
    url = thread.start()
    base = url.removesuffix("/v1")
    try:
        assert httpx.get(base + "/health").status_code == 200
        body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 500, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", url + "/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            llm_engine.forward = lambda batch: 1 / 0   # every step fails from now on
            events = [line.removeprefix("data: ") for line in lines if line]
        assert events[-1] == "[DONE]" and "ZeroDivisionError" in json.loads(events[-2])["error"]["message"]
        waiting = [httpx.post(url + "/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
                   for _ in range(engine.max_failed_steps)]
        assert all(r.status_code in (500, 503) for r in waiting) and waiting[-1].status_code == 503
        assert isinstance(engine.errored, EngineDeadError)
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.json()["error"]["type"] == "server_error"
        r = httpx.post(url + "/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503
    finally:
        del llm_engine.forward
        thread.stop()
        engine.shutdown()
        llm_engine.abort_request([s.request_id for s in list(llm_engine.scheduler.running)
                                  + list(llm_engine.scheduler.waiting)])


def test_a_loop_that_breaks_outside_a_step_fails_every_open_stream(llm_engine):
    engine = AsyncLLMEngine(llm_engine)

    async def run():
        a = await engine.add_request("a", "The history of Rome", LONG)
        b = await engine.add_request("b", "Hi", LONG)   # waiting: max_num_seqs=1
        await first_output(a)
        llm_engine.has_unfinished_requests = lambda: 1 / 0   # the loop itself breaks
        results = []
        for stream in (a, b):
            try:
                async for _ in stream:
                    pass
            except EngineDeadError as e:
                results.append(str(e))
        with pytest.raises(EngineDeadError):
            await engine.add_request("c", "Hi", LONG)
        return results

    try:
        results = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        del llm_engine.has_unfinished_requests
        engine.shutdown()
        llm_engine.abort_request(["a", "b"])
    assert len(results) == 2 and all("ZeroDivisionError" in r for r in results)


@pytest.fixture(scope="module")
def small_body_server(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    thread = ServerThread(build_app(engine, MODEL, limits=ServerLimits(max_body_bytes=2000)))
    url = thread.start()
    yield url, engine
    thread.stop()
    engine.shutdown()


def test_a_body_over_the_limit_gets_413_declared_or_chunked(small_body_server):
    url, _ = small_body_server
    body = {"model": MODEL, "prompt": "x " * 2000, "max_tokens": 1}
    r = httpx.post(url + "/completions", json=body, timeout=30)
    assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"]

    def chunks():   # no Content-Length: the server counts as it reads
        data = json.dumps(body).encode()
        for i in range(0, len(data), 500):
            yield data[i:i + 500]

    r = httpx.post(url + "/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200


def test_tokenizing_runs_off_the_event_loop(small_body_server):
    """A prompt whose tokenizing takes 3 s must not delay /health: it is tokenized in the server's pool."""
    url, _ = small_body_server
    tokenizer_cls = type(small_body_server[1].engine.tokenizer)
    real = tokenizer_cls.__call__

    def slow(self, text, *args, **kwargs):
        if text == "slow":
            time.sleep(3)
        return real(self, text, *args, **kwargs)

    tokenizer_cls.__call__ = slow
    try:
        slow_request = threading.Thread(target=httpx.post, args=(url + "/completions",),
                                        kwargs={"json": {"model": MODEL, "prompt": "slow", "max_tokens": 1},
                                                "timeout": 60})
        slow_request.start()
        time.sleep(0.5)   # the slow tokenizing has begun
        start = time.perf_counter()
        assert httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
        assert time.perf_counter() - start < 1.5
        slow_request.join()
    finally:
        tokenizer_cls.__call__ = real


def test_commands_taken_with_the_one_that_kills_the_loop_are_answered_not_left_hanging(llm_engine):
    engine = AsyncLLMEngine(llm_engine)

    def broken_abort(request_ids):
        raise RuntimeError("simulated fault in abort")

    async def run():
        running = await engine.add_request("a", "The history of Rome", LONG)
        await first_output(running)   # the engine is stepping: the next commands arrive together, mid-step
        llm_engine.abort_request = broken_abort
        await engine.abort("a")
        late = asyncio.ensure_future(engine.add_request("b", "Hi", LONG))
        metrics = asyncio.ensure_future(engine.call(lambda e: "never"))
        results = await asyncio.gather(late, metrics, return_exceptions=True)
        return results, running

    try:
        results, _ = asyncio.run(asyncio.wait_for(run(), 60))   # a command left hanging would time out here
    finally:
        del llm_engine.abort_request
        engine.shutdown()
        llm_engine.abort_request(["a", "b"])
    assert all(isinstance(r, EngineDeadError) for r in results) and "simulated fault in abort" in str(results[0])
