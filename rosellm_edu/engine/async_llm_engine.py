# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable, Iterable

from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 16
logger = logging.getLogger(__name__)


# notebooks/07_serving.ipynb, cell 17
@dataclass
class _Add:
    request_id: str
    prompt: str | dict
    params: SamplingParams
    priority: int                     # lower runs first, under the engine's "priority" scheduling policy
    loop: asyncio.AbstractEventLoop   # the caller's event loop: outputs are handed over there
    outputs: asyncio.Queue            # deltas, each holding only what is new; bounded (max_buffered_outputs)
    added: asyncio.Future             # done when the engine accepted the request, or raised why not
    sent: dict = field(default_factory=dict)   # per sample index: (tokens sent, characters sent, finished)
    closed: bool = False              # an error is queued, the stream's last item: nothing more goes in


# notebooks/07_serving.ipynb, cell 17
@dataclass
class _Abort:
    request_ids: list[str]


# notebooks/07_serving.ipynb, cell 17
@dataclass
class _Call:   # run fn(engine) in the engine thread, between steps
    fn: Callable
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


# notebooks/07_serving.ipynb, cell 17
_STOP = object()


# notebooks/07_serving.ipynb, cell 18
class RequestFailedError(RuntimeError):
    """The engine could not finish this request (its step failed); the other requests go on."""


# notebooks/07_serving.ipynb, cell 18
class EngineDeadError(RuntimeError):
    """The engine loop itself stopped: every open stream, and every request after it, gets this."""


# notebooks/07_serving.ipynb, cell 20
class AsyncLLMEngine:
    """An engine stepping in its own thread; callers in any event loop add requests and await their outputs.

    Only the engine thread touches the engine: callers send it commands (add, abort, call) through a queue, and
    it applies them between steps, so requests join and leave the running batch at step boundaries."""
    max_failed_steps = 3   # steps of one request alone failing in a row, none passing: the engine is broken

    def __init__(self, engine, *, max_buffered_outputs: int = 1024):
        self.engine = engine
        self.max_buffered_outputs = max_buffered_outputs   # outputs a stream may hold unread
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Add] = {}
        self._lock = threading.Lock()     # orders "is it dead?" against "send a command"
        self.errored: EngineDeadError | None = None
        self._taken: list = []   # commands the engine thread took off the queue and has not applied yet
        self._suspects: deque[str] = deque()   # requests to run alone, one after the other, after a failed step
        self._failed_alone: list[str] = []     # requests whose step alone failed, since the last good step
        self._probe_ids = itertools.count(1)
        self._step_start: float | None = None  # the heartbeat: when the running step began, None between steps
        self.step_times: deque = deque(maxlen=4096)   # (start, end) of each step, for measuring the loop
        self._publish_stats()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # notebooks/07_serving.ipynb, cell 21
    async def add_request(self, request_id: str, prompt: str | dict, params: SamplingParams,
                          priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Add a request and return the stream of its outputs, each holding only what is new (vLLM's
        DELTA kind); raises ValueError if the engine refuses it, EngineDeadError if the engine is gone."""
        loop = asyncio.get_running_loop()
        command = _Add(request_id, prompt, params, priority, loop, asyncio.Queue(self.max_buffered_outputs),
                       loop.create_future())
        self._send(command)
        try:
            await command.added
        except asyncio.CancelledError:
            self._send_abort([request_id])
            raise
        return self._outputs(request_id, command.outputs)

    # notebooks/07_serving.ipynb, cell 21
    async def generate(self, prompt: str | dict, params: SamplingParams, request_id: str,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:
        async for out in await self.add_request(request_id, prompt, params, priority):
            yield out

    # notebooks/07_serving.ipynb, cell 23
    async def _outputs(self, request_id: str, outputs: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                if isinstance(out, Exception):   # this request failed, or the whole engine did
                    finished = True
                    raise out
                finished = out.finished
                yield out
        finally:
            if not finished:   # the caller stopped listening (a client went away): free its KV blocks
                self._send_abort([request_id])

    # notebooks/07_serving.ipynb, cell 23
    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests; unknown and finished ids are ignored (awaitable, as vLLM's AsyncLLM.abort)."""
        self._send_abort([request_id] if isinstance(request_id, str) else list(request_id))

    # notebooks/07_serving.ipynb, cell 23
    def _send_abort(self, request_ids: list[str]) -> None:
        if self.errored is None:   # a dead engine holds no request
            self._commands.put(_Abort(request_ids))

    # notebooks/07_serving.ipynb, cell 24
    def _send(self, command) -> None:
        with self._lock:
            if self.errored is not None:
                raise self.errored
            self._commands.put(command)

    # notebooks/07_serving.ipynb, cell 24
    async def call(self, fn: Callable):
        """fn(engine), run in the engine thread between two steps: the one safe way to read the engine."""
        loop = asyncio.get_running_loop()
        command = _Call(fn, loop, loop.create_future())
        self._send(command)
        return await command.done

    # notebooks/07_serving.ipynb, cell 24
    def step_running_for(self) -> float:
        """Seconds the running step has taken so far, 0.0 between steps: the heartbeat that /health checks."""
        start = self._step_start   # read once: the engine thread clears it when the step ends
        return 0.0 if start is None else time.perf_counter() - start

    # notebooks/07_serving.ipynb, cell 24
    def shutdown(self) -> None:
        self._commands.put(_STOP)
        self._thread.join()

    # notebooks/07_serving.ipynb, cell 26
    def _run(self) -> None:
        try:
            while True:
                # Sleep on the queue while there is nothing to run; otherwise only pick up what has arrived.
                self._taken = [] if self.engine.has_unfinished_requests() else [self._commands.get()]
                while not self._commands.empty():
                    self._taken.append(self._commands.get())
                while self._taken:   # taken off the queue, not yet applied: _die answers them if we fail here
                    command = self._taken.pop(0)
                    if command is _STOP:
                        return self._die(EngineDeadError("the engine was shut down"))
                    self._apply(command)
                if self.engine.has_unfinished_requests():
                    self._step()
                self._publish_stats()
        except BaseException as e:   # the loop itself broke: no caller may be left waiting on it
            self._die(e if isinstance(e, EngineDeadError) else EngineDeadError(f"the engine loop stopped: {e!r}"))

    # notebooks/07_serving.ipynb, cell 27
    def _publish_stats(self) -> None:
        """Replace `stats` whole, so that a reader in another thread sees one moment's numbers, never half of two."""
        scheduler = self.engine.scheduler
        self.stats = {"running": len(scheduler.running), "waiting": len(scheduler.waiting),
                      **self.engine.kv_cache_stats()}

    # notebooks/07_serving.ipynb, cell 27
    def _die(self, error: EngineDeadError) -> None:
        """Errored for good: fail every open stream and every command not yet applied, refuse what comes after."""
        with self._lock:
            self.errored = error
            while not self._commands.empty():
                self._taken.append(self._commands.get())
        for command in self._taken:
            if isinstance(command, (_Add, _Call)):
                _post(command.loop, _settle, command.added if isinstance(command, _Add) else command.done, error)
        for stream in self._streams.values():
            _post(stream.loop, self._hand_over, stream, error)
        self._streams.clear()

    # notebooks/07_serving.ipynb, cell 29
    def _apply(self, command) -> None:
        if isinstance(command, _Abort):
            for request_id in command.request_ids:
                self._streams.pop(request_id, None)
            self.engine.abort_request(command.request_ids)   # unknown and finished ids are ignored
        elif isinstance(command, _Call):
            try:
                _post(command.loop, _settle, command.done, None, command.fn(self.engine))
            except Exception as e:
                _post(command.loop, _settle, command.done, e)
        else:
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params, priority=command.priority)
            except Exception as e:  # a bad request (or a tokenizer failing on it) is refused: the batch never sees it
                _post(command.loop, _settle, command.added, e)
                return
            self._streams[command.request_id] = command
            _post(command.loop, _settle, command.added, None)

    # notebooks/07_serving.ipynb, cell 29
    def _step(self) -> None:
        alone = self._next_suspect()   # a request to run alone, after a failed step; None: a normal step
        start = self._step_start = time.perf_counter()
        try:
            outputs = self._step_alone(alone) if alone else self.engine.step()
        except Exception as e:
            return self._step_failed(alone, e)
        finally:
            self._step_start = None
        self._failed_alone.clear()   # the engine can step: the failures before were the requests' own
        self.step_times.append((start, time.perf_counter()))
        if alone and (not self._holds(alone) or any(out.request_id == alone for out in outputs)):
            self._suspects.popleft()   # it sampled alone and nothing failed: cleared
        for out in outputs:
            self._deliver(out)

    # notebooks/07_serving.ipynb, cell 31
    def _step_failed(self, alone: str | None, error: Exception) -> None:
        """Several requests ran: each runs alone next. One ran (alone or not): it is the cause, and it fails."""
        ran = self._put_back() or self._owners(self.engine.scheduler.waiting)   # none admitted: suspect the queue
        if alone is None and len(ran) > 1:
            logger.warning("a step of %d requests failed (%r); running each alone to find the cause", len(ran), error)
            self._suspects.extend(ran)
            return
        culprit = alone or ran[0]
        if alone:
            self._suspects.popleft()
        self._failed_alone.append(culprit)
        logger.error("request %s failed in a step of its own: %r", culprit, error)
        self._fail([culprit], RequestFailedError(f"the engine step failed: {error!r}"))
        if len(self._failed_alone) >= self.max_failed_steps:
            raise EngineDeadError(f"the engine is broken: {len(self._failed_alone)} steps failed in a row, each "
                                  f"running one request alone ({', '.join(self._failed_alone)}), the last with "
                                  f"{error!r}") from error
        self._suspects.appendleft(self._add_probe())   # the request's fault or the engine's? A probe runs next

    # notebooks/07_serving.ipynb, cell 31
    def _add_probe(self) -> str:
        """A request that cannot be at fault: one token after a one-token prompt."""
        request_id = f"engine-probe-{next(self._probe_ids)}"
        self.engine.add_request(request_id, {"prompt_token_ids": [0]}, SamplingParams(temperature=0, max_tokens=1))
        return request_id

    # notebooks/07_serving.ipynb, cell 31
    def _next_suspect(self) -> str | None:
        while self._suspects and not self._holds(self._suspects[0]):
            self._suspects.popleft()   # aborted meanwhile
        return self._suspects[0] if self._suspects else None

    # notebooks/07_serving.ipynb, cell 32
    def _put_back(self) -> list[str]:
        """After a failed step: the requests that were running, now waiting again (their KV to be recomputed).
        A sequence the step finished is removed and its output delivered, as the step would have done."""
        scheduler = self.engine.scheduler
        ran = self._owners(scheduler.running)
        finished = [out for out in self.engine.request_outputs([s for s in scheduler.running if s.finished])
                    if out.finished]
        for seq in reversed(list(scheduler.running)):   # reversed: they keep their order at the queue's front
            scheduler.remove(seq) if seq.finished else scheduler.preempt(seq)
        for out in finished:
            self._deliver(out)
        return [request_id for request_id in ran if self._holds(request_id)]

    # notebooks/07_serving.ipynb, cell 32
    def _step_alone(self, request_id: str) -> list[RequestOutput]:
        """One step of request_id's sequences only: the others running wait again, and the queue is hidden."""
        scheduler = self.engine.scheduler
        for seq in reversed(list(scheduler.running)):
            if self._owner(seq) != request_id:
                scheduler.preempt(seq)
        hidden = [seq for seq in scheduler.waiting if self._owner(seq) != request_id]
        for seq in hidden:
            scheduler.waiting.remove(seq)
        try:
            return self.engine.step()
        finally:
            for seq in hidden:
                scheduler.waiting.append(seq)

    # notebooks/07_serving.ipynb, cell 33
    def _owner(self, seq) -> str:
        """The request a sequence belongs to (a sample of a request with n > 1 answers for its request)."""
        parent = self.engine.scheduler.parents.get(seq.request_id)
        return seq.request_id if parent is None else parent.request_id

    # notebooks/07_serving.ipynb, cell 33
    def _owners(self, seqs) -> list[str]:
        return list(dict.fromkeys(self._owner(seq) for seq in seqs))   # in order, each once

    # notebooks/07_serving.ipynb, cell 33
    def _holds(self, request_id: str) -> bool:
        return self.engine.scheduler.find(request_id) is not None or request_id in self.engine.scheduler.parents

    # notebooks/07_serving.ipynb, cell 35
    def _fail(self, request_ids: list[str], error: Exception) -> None:
        self.engine.abort_request(request_ids)
        for request_id in request_ids:
            stream = self._streams.pop(request_id, None)   # None: a probe, which no one reads
            if stream is not None:
                _post(stream.loop, self._hand_over, stream, error)

    # notebooks/07_serving.ipynb, cell 35
    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        if not _post(stream.loop, self._hand_over, stream, delta(out, stream)) and not out.finished:
            self._apply(_Abort([out.request_id]))   # its event loop is gone

    # notebooks/07_serving.ipynb, cell 36
    def _hand_over(self, stream: _Add, item: RequestOutput | Exception) -> None:
        """In the caller's event loop: queue an output or an error; a reader too far behind is cut off."""
        if stream.closed:
            return
        if stream.outputs.full():
            if not isinstance(item, Exception):
                logger.warning("request %s: %d outputs unread, its client stopped reading; aborting it",
                               stream.request_id, stream.outputs.maxsize)
                self._send_abort([stream.request_id])
                item = RequestFailedError(f"{stream.outputs.maxsize} outputs waited unread "
                                          "(max_buffered_outputs, rosellm-edu serve --max-buffered-outputs): "
                                          "the client reads too slowly")
            while not stream.outputs.empty():   # the error goes first: what was not read is dropped
                stream.outputs.get_nowait()
        stream.closed = isinstance(item, Exception)
        stream.outputs.put_nowait(item)


# notebooks/07_serving.ipynb, cell 36
def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run fn(*args) in loop's thread; False if that loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


# notebooks/07_serving.ipynb, cell 36
def _settle(future: asyncio.Future, error: Exception | None, result=None) -> None:
    if not future.done():   # the caller may have been cancelled meanwhile
        future.set_exception(error) if error else future.set_result(result)


# notebooks/07_serving.ipynb, cell 38
def delta(out: RequestOutput, stream: _Add) -> RequestOutput:
    """What is new in out since the stream's previous output: only new tokens, text, logprobs and masks.
    Text that may still become a stop string, or is half a UTF-8 character, is held back (chapter 03)."""
    hold = max(map(len, stream.params.stop), default=1) - 1
    completions = []
    for c in out.outputs:
        tokens, chars, reported = stream.sent.get(c.index, (0, 0, False))
        end = len(c.text) if c.finish_reason else max(len(c.text.rstrip("\ufffd")) - hold, chars)
        if reported or (len(c.token_ids) == tokens and end == chars and not c.finish_reason):
            continue   # nothing new for this sample
        stream.sent[c.index] = (len(c.token_ids), end, c.finish_reason is not None)
        cut = lambda xs: None if xs is None else xs[tokens:]   # noqa: E731
        completions.append(replace(c, text=c.text[chars:end], token_ids=c.token_ids[tokens:],
                                   logprobs=cut(c.logprobs), sampling_mask=cut(c.sampling_mask),
                                   sampling_logz=cut(c.sampling_logz)))
    first = "prompt" not in stream.sent
    stream.sent.setdefault("prompt", out.prompt_token_ids)   # one list for every delta of this request
    return replace(out, prompt_token_ids=stream.sent["prompt"], outputs=completions,
                   prompt_logprobs=out.prompt_logprobs if first else None)
