# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb, notebooks/13b_model_checkpoints.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import copy
import queue
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from rosellm_edu.engine.async_llm_engine import EngineDeadError, RequestFailedError
from rosellm_edu.entrypoints.openai.errors import OpenAIError, check_fields, invalid_parameter
from rosellm_edu.entrypoints.openai.protocol import (ErrorInfo, ErrorResponse, OpenAIBaseModel, SamplingRequest,
                                                     StreamOptions, UsageInfo, strings)
from rosellm_edu.outputs import Logprob, RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/07a_server_hardening.ipynb, cell 22
LARGE_PROMPT_CHARS = 16_384   # a request with more text is tokenized in the lane for large ones


# notebooks/07a_server_hardening.ipynb, cell 22
class TokenizerLanes:
    """Threads that tokenize, each with its own tokenizer: `workers` for ordinary requests, one for large ones."""

    def __init__(self, tokenizer, workers: int):
        copies = queue.SimpleQueue()
        for _ in range(workers + 1):
            copies.put(copy.deepcopy(tokenizer))
        self.local = threading.local()
        take = lambda: setattr(self.local, "tokenizer", copies.get())   # noqa: E731  (once per thread)
        self.small = ThreadPoolExecutor(workers, "tokenizer", initializer=take)
        self.large = ThreadPoolExecutor(1, "tokenizer-large", initializer=take)

    async def run(self, chars: int, fn: Callable, *args):
        lane = self.large if chars > LARGE_PROMPT_CHARS else self.small
        return await asyncio.get_running_loop().run_in_executor(lane, self.call, fn, *args)

    def call(self, fn: Callable, *args):
        return fn(self.local.tokenizer, *args)


# notebooks/07a_server_hardening.ipynb, cell 22
async def in_pool(raw: Request, fn: Callable, *args):
    """fn(tokenizer, *args) in a tokenizer thread, in the lane that the size of the text given to it picks."""
    return await raw.app.state.lanes.run(sum(len(text) for arg in args for text in strings(arg)), fn, *args)


# notebooks/07_serving.ipynb, cell 66
def check_model(raw: Request, model: str | None) -> None:
    served = raw.app.state.model_name
    if model is not None and model != served:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves {served!r}", "model",
                          "model_not_found")


# notebooks/07a_server_hardening.ipynb, cell 23
def check_request(raw: Request, body: OpenAIBaseModel) -> None:
    """What every route checks before any work: the model, the fields, the limits, and priority."""
    check_model(raw, body.model)
    for part in [body, *(getattr(body, "messages", None) or [])]:
        check_fields(part)
    raw.app.state.limits.check(body)
    if getattr(body, "priority", 0) and raw.app.state.engine.engine.scheduler.policy != "priority":
        raise OpenAIError(400, "priority: this server schedules first come, first served (rosellm-edu serve "
                          "--scheduling-policy priority schedules by it)", "priority")


# notebooks/07_serving.ipynb, cell 68
@dataclass
class Piece:
    """What one engine step added to one choice of a response (the prompt too, when echoed)."""
    index: int                                     # the choice: prompt i, sample j -> i * n + j
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None] | None   # per token; None for an echoed prompt's first token
    finish_reason: str | None = None
    mask: dict | None = None                       # sampling_mask and sampling_logz, when asked
    offset: int = 0                                # characters of this choice sent before this piece

    def __add__(self, later: "Piece") -> "Piece":
        logprobs = None if self.logprobs is None or later.logprobs is None else self.logprobs + later.logprobs
        mask = later.mask if self.mask is None else {k: _concat(v, later.mask[k]) for k, v in self.mask.items()}
        return replace(self, text=self.text + later.text, token_ids=self.token_ids + later.token_ids,
                       logprobs=logprobs, finish_reason=later.finish_reason, mask=mask)


# notebooks/07_serving.ipynb, cell 68
def _concat(a: list | None, b: list | None) -> list | None:
    return None if a is None and b is None else (a or []) + (b or [])


# notebooks/07_serving.ipynb, cell 68
def sse(event: BaseModel) -> str:
    """One server-sent event: a `data:` line with the JSON, then a blank line."""
    return f"data: {event.model_dump_json()}\n\n"


# notebooks/07_serving.ipynb, cell 69
class ResponseState:
    """One response being assembled from its engine requests' deltas: pieces, usage and timings."""

    def __init__(self, raw: Request, body: SamplingRequest, prompts: list[tuple[str | None, list[int]]],
                 echo: bool = False):
        self.body, self.app, self.start, self.first_token = body, raw.app, time.perf_counter(), None
        self.prompt_tokens, self.completion_tokens = sum(len(ids) for _, ids in prompts), 0
        self.echo = dict(enumerate(prompts)) if echo else {}   # prompt i -> (text, ids), until its first piece
        self.echoed: set[int] = set()
        self.sent_chars: dict[int, int] = {}

    def pieces(self, i: int, out: RequestOutput) -> list[Piece]:
        pieces = []
        for c in out.outputs:
            index = i * self.body.n + c.index
            mask = ({"sampling_mask": c.sampling_mask, "sampling_logz": c.sampling_logz}
                    if self.body.return_sampling_mask else None)
            piece = Piece(index, c.text, c.token_ids, c.logprobs, c.finish_reason, mask)
            if i in self.echo and index not in self.echoed:   # the prompt goes first, with its logprobs
                self.echoed.add(index)
                text, ids = self.echo[i]
                piece = Piece(index, text, ids, out.prompt_logprobs, None, mask and {k: [] for k in mask}) + piece
            pieces.append(replace(piece, offset=self.sent_chars.get(index, 0)))
            self.sent_chars[index] = pieces[-1].offset + len(piece.text)
            self.completion_tokens += len(c.token_ids)
            self.first_token = self.first_token or (time.perf_counter() if c.token_ids else None)
        return pieces

    def usage(self) -> UsageInfo:
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                         total_tokens=self.prompt_tokens + self.completion_tokens)

    # notebooks/07a_server_hardening.ipynb, cell 14
    def finished(self) -> None:
        """A response whose every choice ended: its latencies go to the histograms."""
        now, m = time.perf_counter(), self.app.state.metrics
        m.e2e.observe(now - self.start)
        m.prompt_tokens.inc(self.prompt_tokens)
        m.generation_tokens.inc(self.completion_tokens)
        if self.first_token is not None:
            m.ttft.observe(self.first_token - self.start)
            if self.completion_tokens > 1:
                m.tpot.observe((now - self.first_token) / (self.completion_tokens - 1))


# notebooks/07_serving.ipynb, cell 70
async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The outputs of several engine requests (a batch of prompts), as they come: (prompt index, delta)."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    arrived: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        try:
            async for out in stream:
                arrived.put_nowait((i, out))
        except Exception as e:
            arrived.put_nowait((i, e))
        arrived.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while (item := await arrived.get())[1] is not None:
                if isinstance(item[1], Exception):
                    raise item[1]
                yield item
    finally:
        for task in tasks:   # a client that left: cancelling each stream aborts its request
            task.cancel()


# notebooks/07_serving.ipynb, cell 72
async def stream_events(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]],
                        make_chunk: Callable[[Piece], BaseModel],
                        make_usage_chunk: Callable[[UsageInfo | None], BaseModel]) -> AsyncIterator[str]:
    """A chunk per step and choice, usage as asked (in every chunk, or in a last one), then `data: [DONE]`."""
    options = state.body.stream_options or StreamOptions()
    try:
        async for i, out in outputs:
            for piece in state.pieces(i, out):
                chunk = make_chunk(piece)
                if options.include_usage and options.continuous_usage_stats:
                    chunk.usage = state.usage()
                yield sse(chunk)
        state.finished()
        if options.include_usage:
            yield sse(make_usage_chunk(state.usage()))
    except (RequestFailedError, EngineDeadError) as e:   # the stream is open: say so in it, then end it
        yield sse(ErrorResponse(error=ErrorInfo(message=str(e), type="server_error")))
    yield "data: [DONE]\n\n"


# notebooks/07_serving.ipynb, cell 72
def event_stream(raw: Request, request_id: str, n: int, events: AsyncIterator[str]) -> StreamingResponse:
    # When the client goes away, Starlette cancels the body iterator, and the engine aborts the requests; the
    # background abort also covers a client that left before the first chunk (a no-op once they finished).
    ids = [f"{request_id}-{i}" for i in range(n)]
    return StreamingResponse(events, media_type="text/event-stream",
                             background=BackgroundTask(raw.app.state.engine.abort, ids))


# notebooks/07_serving.ipynb, cell 72
async def collect(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> list[Piece]:
    """A whole response: every choice's pieces joined, in choice order."""
    choices: dict[int, Piece] = {}
    async for i, out in outputs:
        for piece in state.pieces(i, out):
            choices[piece.index] = choices[piece.index] + piece if piece.index in choices else piece
    state.finished()
    return [choices[index] for index in sorted(choices)]


# notebooks/07_serving.ipynb, cell 73
async def until_disconnected(raw: Request, work: Awaitable):
    """Await work, unless the client disconnects first: then cancel it (which aborts its request), None."""
    async def disconnected():
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if not task.done():
        task.cancel()
        return None
    return task.result()


# notebooks/07_serving.ipynb, cell 73
async def whole_response(raw: Request, state: ResponseState,
                         outputs: AsyncIterator[tuple[int, RequestOutput]]) -> list[Piece] | None:
    """Every choice's pieces; None if the client left. A failed request is a 500, a dead engine a 503."""
    try:
        return await until_disconnected(raw, collect(state, outputs))
    except RequestFailedError as e:
        raise OpenAIError(500, str(e), type="server_error") from e


# notebooks/07_serving.ipynb, cell 75
def encode_prompts(tokenizer, prompts: list[str | list[int]], echo: bool) -> list[tuple[str | None, list[int]]]:
    """(text, token ids) of each prompt; token-id prompts get their text only when it is echoed."""
    if echo and not all(0 <= t < len(tokenizer) for p in prompts if not isinstance(p, str) for t in p):
        raise OpenAIError(400, f"prompt: token ids must be integers in [0, {len(tokenizer)})", "prompt")
    return [(p, tokenizer(p).input_ids) if isinstance(p, str) else (tokenizer.decode(p) if echo else None, p)
            for p in prompts]


# notebooks/07_serving.ipynb, cell 75
def chat_prompt_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                             return_dict=True)["input_ids"]
    except Exception as e:   # the template's own refusal (roles out of order) says what is wrong; others do not
        why = str(e) if type(e).__name__ == "TemplateError" else "the conversation could not be formatted"
        raise OpenAIError(400, f"messages: the model's chat template failed: {why}", "messages") from e


# notebooks/07_serving.ipynb, cell 75
def check_prompt(raw: Request, ids: list[int], max_tokens: int | None, param: str) -> int:
    """The prompt fits the model and max_tokens fits beside it (vLLM's rule: refused, never silently capped);
    None means all the room the context leaves. Returns the max_tokens to generate."""
    engine = raw.app.state.engine.engine
    limit, vocab = engine.max_model_len, engine.vocab_size
    if not ids:
        raise OpenAIError(400, f"{param}: the prompt is empty", param)
    if not all(0 <= t < vocab for t in ids):
        raise OpenAIError(400, f"{param}: prompt token ids must be in [0, {vocab})", param)
    if len(ids) >= limit:
        raise OpenAIError(400, f"{param}: this model's maximum context length is {limit} tokens, and the prompt "
                          f"has {len(ids)}, leaving no room to generate", param)
    if max_tokens is not None and len(ids) + max_tokens > limit:
        raise OpenAIError(400, f"max_tokens: this model's maximum context length is {limit} tokens; you asked "
                          f"for {len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} in the completion)",
                          "max_tokens")
    return limit - len(ids) if max_tokens is None else max_tokens


# notebooks/13b_model_checkpoints.ipynb, cell 16
def sampling_params(raw: Request, body: SamplingRequest, max_tokens: int, logprobs: int | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The request's SamplingParams, the model's defaults in the fields it left unset; token ids it names
    (logit_bias, stop_token_ids) must be in the vocabulary, or a step would fail on them."""
    engine = raw.app.state.engine.engine
    defaults = engine.get_diff_sampling_param()
    unset = {name: value for name, value in defaults.items()                           # None = not sent
             if name != "max_tokens" and name in type(body).model_fields and getattr(body, name) is None}
    body = body.model_copy(update=unset)
    max_tokens = min(max_tokens, defaults.get("max_tokens", max_tokens))              # vLLM's cap
    try:
        params = body.to_sampling_params(max_tokens, logprobs, prompt_logprobs)
    except ValueError as e:
        raise invalid_parameter(e) from e
    for name, ids in [("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)]:
        if not all(0 <= t < engine.vocab_size for t in ids):
            raise OpenAIError(400, f"{name}: token ids must be in [0, {engine.vocab_size})", name)
    return params


# notebooks/07_serving.ipynb, cell 76
async def add_requests(raw: Request, request_id: str, prompts: list[tuple[str | None, list[int]]],
                       params: list[SamplingParams], priority: int = 0) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per prompt (ids request_id-0, -1, ...): all of them are added, or none."""
    engine, streams = raw.app.state.engine, []
    try:
        for i, ((text, ids), p) in enumerate(zip(prompts, params)):
            prompt = {"prompt": text, "prompt_token_ids": ids}
            streams.append(await engine.add_request(f"{request_id}-{i}", prompt, p, priority))
    except BaseException as e:
        await engine.abort([f"{request_id}-{j}" for j in range(len(streams))])
        if isinstance(e, ValueError):   # refused by the engine (a KV cache too small for it): no internal ids
            message = re.sub(r"request '[^']*'", "the request", re.sub(r"^request '[^']*': ", "", str(e)))
            raise OpenAIError(400, message) from e
        raise
    return streams


# notebooks/07_serving.ipynb, cell 78
def clamp(logprob: float) -> float:
    return max(logprob, -9999.0)   # JSON has no -inf (OpenAI and vLLM clamp the same way)


# notebooks/07_serving.ipynb, cell 78
def token_text(tokenizer, token: int, entry: Logprob | None) -> str:
    return entry.decoded_token if entry is not None and entry.decoded_token is not None else tokenizer.decode([token])
