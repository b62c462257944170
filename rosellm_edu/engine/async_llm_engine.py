# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator

from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 16
@dataclass
class _Add:
    request_id: str
    prompt: str | dict
    params: SamplingParams
    loop: asyncio.AbstractEventLoop   # the caller's event loop: outputs are handed over there
    outputs: asyncio.Queue
    added: asyncio.Future             # done when the engine accepted the request, or raised why not


# notebooks/07_serving.ipynb, cell 16
@dataclass
class _Abort:
    request_id: str


# notebooks/07_serving.ipynb, cell 16
_STOP = object()


# notebooks/07_serving.ipynb, cell 18
class AsyncLLMEngine:
    """An engine stepping in its own thread; callers in any event loop add requests and await their outputs.

    Only the engine thread touches the engine: callers send it commands (add, abort) through a queue, and it
    applies them between steps, so requests join and leave the running batch at step boundaries."""

    def __init__(self, engine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Add] = {}
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def add_request(self, request_id: str, prompt: str | dict,
                          params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Add a request and return the stream of its outputs; raises ValueError if the engine refuses it."""
        loop = asyncio.get_running_loop()
        command = _Add(request_id, prompt, params, loop, asyncio.Queue(), loop.create_future())
        self._commands.put(command)
        try:
            await command.added
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return self._outputs(request_id, command.outputs)

    async def generate(self, prompt: str | dict, params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        async for out in await self.add_request(request_id, prompt, params):
            yield out

    # notebooks/07_serving.ipynb, cell 20
    async def _outputs(self, request_id: str, outputs: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                if isinstance(out, Exception):
                    raise out
                finished = out.finished
                yield out
        finally:
            if not finished:   # the caller stopped listening (a client went away): free its KV blocks
                self.abort(request_id)

    # notebooks/07_serving.ipynb, cell 20
    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    # notebooks/07_serving.ipynb, cell 20
    def shutdown(self) -> None:
        self._commands.put(_STOP)
        self._thread.join()

    # notebooks/07_serving.ipynb, cell 22
    def _run(self) -> None:
        while True:
            # Sleep on the queue while there is nothing to run; otherwise only pick up what has arrived.
            commands = [] if self.engine.has_unfinished_requests() else [self._commands.get()]
            while not self._commands.empty():
                commands.append(self._commands.get())
            for command in commands:
                if command is _STOP:
                    for stream in self._streams.values():
                        _post(stream.loop, stream.outputs.put_nowait, RuntimeError("the engine was shut down"))
                    return
                self._apply(command)
            if self.engine.has_unfinished_requests():
                self._step()

    # notebooks/07_serving.ipynb, cell 22
    def _apply(self, command) -> None:
        if isinstance(command, _Abort):
            if self._streams.pop(command.request_id, None) is not None:
                self.engine.abort_request(command.request_id)
            return
        try:
            self.engine.add_request(command.request_id, command.prompt, command.params)
        except Exception as e:  # a bad request is refused; it never reaches the batch
            _post(command.loop, _settle, command.added, e)
            return
        self._streams[command.request_id] = command
        _post(command.loop, _settle, command.added, None)

    # notebooks/07_serving.ipynb, cell 24
    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # a failed step fails the requests in flight, not the server
            for request_id, stream in list(self._streams.items()):
                self._apply(_Abort(request_id))
                _post(stream.loop, stream.outputs.put_nowait, RuntimeError(f"engine step failed: {e!r}"))
            return
        for out in outputs:
            stream = self._streams[out.request_id]
            if out.finished:
                del self._streams[out.request_id]
            if not _post(stream.loop, stream.outputs.put_nowait, out) and not out.finished:
                self._apply(_Abort(out.request_id))   # its event loop is gone


# notebooks/07_serving.ipynb, cell 24
def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run fn(*args) in loop's thread; False if that loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


# notebooks/07_serving.ipynb, cell 24
def _settle(future: asyncio.Future, error: Exception | None) -> None:
    if not future.done():   # the caller may have been cancelled meanwhile
        future.set_exception(error) if error else future.set_result(None)
