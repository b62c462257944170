"""AsyncLLMEngine's own guarantees: a failing step fails only the request that caused it (the others finish with
the text they have alone), a burst of bad requests leaves the engine alive while an engine that cannot step is
declared dead; the heartbeat and the stats snapshot are readable while a step hangs; a stream whose reader stops is
cut off at max_buffered_outputs; the request's priority reaches the scheduler. Through the server: /health is a 503
while a step hangs past max_step_seconds and /metrics still answers; a raw socket client that never reads is
aborted and the other streams finish."""

import asyncio
import json
import logging
import socket
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
MARK = 31999   # a token id no prompt below holds but the bad ones: a step that holds it fails
GOOD = {"rome": "The history of Rome", "paris": "The capital of France is", "count": "Count to ten: one, two,"}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm_engine():
    return LLMEngine(max_num_seqs=8, **ENGINE_KWARGS)


@pytest.fixture(scope="module")
def alone(llm_engine):
    """Each good prompt's greedy text, run by itself."""
    engine = AsyncLLMEngine(llm_engine)
    try:
        return {name: asyncio.run(text_of(engine, prompt, name)) for name, prompt in GOOD.items()}
    finally:
        engine.shutdown()


@pytest.fixture
def async_engine(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    yield engine
    engine.shutdown()
    llm_engine.abort_request([seq.request_id for seq in list(llm_engine.scheduler.requests.values())])
    llm_engine.__dict__.pop("forward", None)


def bad_prompt(llm_engine, text: str) -> dict:
    return {"prompt_token_ids": llm_engine.tokenizer(text).input_ids + [MARK]}


def fail_on_mark(llm_engine, after_tokens: int) -> None:
    """The forward pass raises for any batch holding a marked prompt that has generated after_tokens or more."""
    def forward(batch):
        if any(MARK in s.seq.prompt_token_ids and len(s.seq.output_token_ids) >= after_tokens for s in batch):
            raise RuntimeError("simulated fault: a marked token")
        return LLMEngine.forward(llm_engine, batch)
    llm_engine.forward = forward


async def text_of(engine: AsyncLLMEngine, prompt, request_id: str, params: SamplingParams = GREEDY) -> str:
    return "".join([out.outputs[0].text async for out in engine.generate(prompt, params, request_id)])


async def outcome(engine, prompt, request_id):
    try:
        return await text_of(engine, prompt, request_id)
    except (RequestFailedError, EngineDeadError) as e:
        return e


def all_blocks_free(llm_engine, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = llm_engine.kv_cache_stats()
        if stats["free_blocks"] == stats["total_blocks"] and not llm_engine.has_unfinished_requests():
            return True
        time.sleep(0.02)
    return False


def test_a_fault_mid_batch_fails_only_its_request_and_the_others_keep_their_text(async_engine, llm_engine, alone,
                                                                                  caplog):
    assert not any(MARK in llm_engine.tokenizer(p).input_ids for p in GOOD.values())
    fail_on_mark(llm_engine, after_tokens=3)   # the bad request decodes beside the others, then a step fails

    async def run():
        names = list(GOOD) + ["bad"]
        prompts = list(GOOD.values()) + [bad_prompt(llm_engine, "Tell me a story")]
        return dict(zip(names, await asyncio.gather(*[outcome(async_engine, p, n) for n, p in zip(names, prompts)])))

    with caplog.at_level(logging.WARNING, logger="rosellm_edu.engine.async_llm_engine"):
        results = asyncio.run(asyncio.wait_for(run(), 300))
    assert isinstance(results.pop("bad"), RequestFailedError)
    assert results == alone
    assert "running each alone" in caplog.text and "request bad failed in a step of its own" in caplog.text
    assert async_engine.errored is None and all_blocks_free(llm_engine)


def test_a_burst_of_bad_requests_fails_each_of_them_and_the_engine_lives(async_engine, llm_engine, alone):
    fail_on_mark(llm_engine, after_tokens=0)   # every step a bad request is in fails

    async def run():
        bad = [outcome(async_engine, bad_prompt(llm_engine, f"Story number {i}"), f"bad{i}") for i in range(5)]
        return await asyncio.gather(outcome(async_engine, GOOD["rome"], "rome"), *bad)

    good, *bad = asyncio.run(asyncio.wait_for(run(), 300))
    assert good == alone["rome"] and all(isinstance(e, RequestFailedError) for e in bad)
    assert async_engine.errored is None
    assert asyncio.run(text_of(async_engine, GOOD["paris"], "after")) == alone["paris"]


def test_an_engine_that_cannot_step_alone_is_declared_dead(async_engine, llm_engine):
    llm_engine.forward = lambda batch: 1 / 0

    async def run():
        return await asyncio.gather(*[outcome(async_engine, p, n) for n, p in GOOD.items()])

    first, *rest = asyncio.run(asyncio.wait_for(run(), 120))
    assert isinstance(first, RequestFailedError) and all(isinstance(e, EngineDeadError) for e in rest)
    message = str(async_engine.errored)
    assert f"{async_engine.max_failed_steps} steps failed in a row, each running one request alone" in message
    assert "engine-probe-" in message and "ZeroDivisionError" in message


def hang_once(llm_engine):
    """A forward that blocks its first step until released: (entered, release, the forward to install)."""
    entered, release = threading.Event(), threading.Event()

    def hanging_forward(batch):
        del llm_engine.forward   # hang once
        entered.set()
        release.wait(60)
        return LLMEngine.forward(llm_engine, batch)

    return entered, release, hanging_forward


def test_the_heartbeat_and_the_stats_are_read_while_a_step_hangs(async_engine, llm_engine):
    entered, release, hanging_forward = hang_once(llm_engine)

    async def run():
        stream = await async_engine.add_request("a", GOOD["rome"], GREEDY)
        await stream.__anext__()
        llm_engine.forward = hanging_forward
        assert await asyncio.to_thread(entered.wait, 60)
        await asyncio.sleep(0.3)
        hung, stats = async_engine.step_running_for(), async_engine.stats   # no call into the engine thread
        release.set()
        return hung, stats, [out async for out in stream]

    hung, stats, rest = asyncio.run(asyncio.wait_for(run(), 120))
    assert hung >= 0.3 and stats["running"] == 1 and stats["free_blocks"] < stats["total_blocks"]
    assert rest[-1].finished and async_engine.step_running_for() == 0.0
    assert all_blocks_free(llm_engine)
    deadline = time.monotonic() + 10   # the snapshot after the last step
    while async_engine.stats["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert async_engine.stats["running"] == 0 and async_engine.stats["free_blocks"] == stats["total_blocks"]


def test_a_reader_that_stops_is_cut_off_at_max_buffered_outputs_and_the_others_go_on(llm_engine, alone, caplog):
    engine = AsyncLLMEngine(llm_engine, max_buffered_outputs=4)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def run():
        unread = await engine.add_request("unread", "Count to a thousand:", long)
        read = await text_of(engine, GOOD["rome"], "rome")   # 12 steps: 12 outputs for "unread" to hold
        deadline = time.monotonic() + 20
        while llm_engine.scheduler.find("unread") is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        with pytest.raises(RequestFailedError, match="max_buffered_outputs"):
            async for _ in unread:
                pass
        return read

    try:
        with caplog.at_level(logging.WARNING, logger="rosellm_edu.engine.async_llm_engine"):
            read = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        engine.shutdown()
    assert read == alone["rome"] and "request unread: 4 outputs unread" in caplog.text
    assert all_blocks_free(llm_engine)


def test_priority_reaches_the_scheduler():
    llm_engine = LLMEngine(max_num_seqs=1, scheduling_policy="priority", **ENGINE_KWARGS)
    engine = AsyncLLMEngine(llm_engine)
    finished = []

    async def run(request_id, priority, started=None):
        stream = await engine.add_request(request_id, GOOD["paris"], GREEDY, priority=priority)
        async for _ in stream:
            if started is not None:
                started.set()   # it runs, holding the one seat
        finished.append(request_id)

    async def main():
        first = asyncio.Event()
        running = asyncio.ensure_future(run("running", 0, first))
        await first.wait()   # the two below wait for its seat, and the lower value goes first
        await asyncio.gather(run("later", 5), run("sooner", -1), running)

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        engine.shutdown()
    assert finished.index("sooner") < finished.index("later")   # first come, first served would swap them


def test_health_is_503_while_a_step_hangs_past_max_step_seconds_and_metrics_still_answers(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    thread = ServerThread(build_app(engine, MODEL, limits=ServerLimits(max_step_seconds=0.3)))
    url = thread.start()
    base = url.removesuffix("/v1")
    entered, release, hanging_forward = hang_once(llm_engine)

    request = threading.Thread(target=httpx.post, args=(url + "/completions",),
                               kwargs={"json": {"model": MODEL, "prompt": "Hi", "max_tokens": 2}, "timeout": 60})
    try:
        assert httpx.get(base + "/health").status_code == 200
        llm_engine.forward = hanging_forward
        request.start()
        assert entered.wait(60)
        time.sleep(0.5)
        health = httpx.get(base + "/health", timeout=5)
        metrics = httpx.get(base + "/metrics", timeout=5)
        release.set()
        request.join(60)
        assert health.status_code == 503 and health.json()["error"]["type"] == "server_error"
        message = health.json()["error"]["message"]
        assert "max_step_seconds=0.3" in message and "--max-step-seconds" in message
        assert metrics.status_code == 200 and "rosellm:num_requests_running" in metrics.text
        assert httpx.get(base + "/health").status_code == 200
    finally:
        release.set()
        llm_engine.__dict__.pop("forward", None)
        thread.stop()
        engine.shutdown()


def test_a_raw_client_that_never_reads_is_aborted_and_the_other_streams_finish(llm_engine, alone, caplog):
    engine = AsyncLLMEngine(llm_engine, max_buffered_outputs=4)
    thread = ServerThread(build_app(engine, MODEL))
    url = thread.start()
    for listener in thread.server.servers[0].sockets:   # accepted sockets inherit it: no loopback-sized buffers
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    body = json.dumps({"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 400, "ignore_eos": True,
                       "n": 4, "logprobs": 5, "stream": True}).encode()
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a small window: the server's writes back up
    try:
        with caplog.at_level(logging.WARNING, logger="rosellm_edu.engine.async_llm_engine"):
            silent.connect((host, int(port)))
            silent.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)   # and never reads
            stream = {"model": MODEL, "prompt": GOOD["rome"], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                      "stream": True}
            with httpx.stream("POST", url + "/completions", json=stream, timeout=120) as r:
                events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
            assert events[-1] == "[DONE]"
            text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
            assert text == alone["rome"]
            assert all_blocks_free(llm_engine, timeout=120)   # the silent client still holds its socket open
        assert "outputs unread, its client stopped reading; aborting it" in caplog.text
        assert engine.errored is None
    finally:
        silent.close()
        thread.stop()
        engine.shutdown()
