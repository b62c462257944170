# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import copy
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import AsyncIterator, Awaitable, Callable

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError, RequestFailedError
from rosellm_edu.entrypoints.openai.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                                     ChatCompletionRequest, ChatCompletionResponse, ChatLogprob,
                                                     ChatLogprobs, ChatMessageOut, CompletionChoice,
                                                     CompletionLogprobs, CompletionRequest, CompletionResponse,
                                                     DeltaMessage, DetokenizeRequest, DetokenizeResponse, ErrorInfo,
                                                     ErrorResponse, ModelCard, ModelList, OpenAIBaseModel,
                                                     SamplingRequest, StreamOptions, TokenizeRequest, TokenizeResponse,
                                                     TopLogprob, UsageInfo, random_id, unimplemented_fields)
from rosellm_edu.outputs import Logprob, RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 4
class ServerThread:
    """uvicorn serving an app from a background thread, on a free port: for notebooks and tests."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; return the base URL of the OpenAI API."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}/v1"

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


# notebooks/07_serving.ipynb, cell 52
logger = logging.getLogger("rosellm_edu.server")


# notebooks/07_serving.ipynb, cell 52
router = APIRouter()


# notebooks/07_serving.ipynb, cell 53
class OpenAIError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error body that says why."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.info).model_dump(), status_code=self.status)


# notebooks/07_serving.ipynb, cell 53
ERRORS = {status: {"model": ErrorResponse, "description": why} for status, why in [
    (400, "the request is invalid"), (404, "no such model"), (413, "the body is too large"),
    (500, "the engine failed this request"), (503, "the engine has stopped")]}


# notebooks/07_serving.ipynb, cell 55
def invalid_parameter(e: ValueError) -> OpenAIError:
    """SamplingParams names the field it refuses ("SamplingParams.top_p must be ..."): that is the param."""
    name = str(e).removeprefix("SamplingParams.").split(" ")[0] if str(e).startswith("SamplingParams.") else None
    return OpenAIError(400, str(e).removeprefix("SamplingParams."), name)


# notebooks/07_serving.ipynb, cell 55
def check_fields(body: OpenAIBaseModel) -> None:
    """vLLM's rule for fields we do not implement: at their no-op value, accepted and logged; else a 400."""
    ignored, refused = unimplemented_fields(body)
    if ignored:
        logger.warning("ignoring fields this server does not implement (at their no-op values): %s", ignored)
    if refused:
        raise OpenAIError(400, f"{', '.join(refused)}: not supported by this server", refused[0])


# notebooks/07_serving.ipynb, cell 56
async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


# notebooks/07a_server_hardening.ipynb, cell 5
def from_validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first thing pydantic found wrong with the body, in OpenAI's form."""
    error = exc.errors()[0]
    if error["type"] == "json_invalid":
        return OpenAIError(400, f"the request body is not valid JSON ({error['ctx']['error']})")
    param = ".".join(str(part) for part in error["loc"][1:]) or None   # loc starts with "body"
    message = error["msg"].removeprefix("Value error, ")
    return OpenAIError(400, f"{param}: {message}" if param else f"request body: {message}", param)


# notebooks/07a_server_hardening.ipynb, cell 5
async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_error(exc).response()


# notebooks/07a_server_hardening.ipynb, cell 5
async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return OpenAIError(exc.status_code, str(exc.detail)).response()   # unknown route, wrong method, too large


# notebooks/07a_server_hardening.ipynb, cell 5
async def engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:
    return OpenAIError(503, str(exc), type="server_error").response()


# notebooks/07a_server_hardening.ipynb, cell 5
async def server_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("internal error", exc_info=exc)   # the details go to the log, not to the client
    return OpenAIError(500, f"internal server error ({type(exc).__name__})", type="server_error").response()


# notebooks/07a_server_hardening.ipynb, cell 7
class BodyLimit:
    """ASGI middleware: a body over max_bytes gets a 413 before anyone parses it (a declared Content-Length is
    checked at once; a chunked body is counted as it arrives)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self.too_large().response()(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413, self.too_large().info.message)
            return message

        await self.app(scope, counting_receive, send)

    def too_large(self) -> OpenAIError:
        return OpenAIError(413, f"the request body is larger than this server's limit of {self.max_bytes} bytes "
                           "(rosellm-edu serve --max-request-body-bytes)")


# notebooks/07a_server_hardening.ipynb, cell 8
def openapi_schema(app: FastAPI) -> dict:
    """FastAPI's schema, corrected to say what this server really answers: a body pydantic refuses is a 400
    in OpenAI's shape (declared with ERRORS), never FastAPI's 422."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema["paths"].values():
            for operation in path.values():
                operation["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


# notebooks/07a_server_hardening.ipynb, cell 10
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


# notebooks/07a_server_hardening.ipynb, cell 10
class ServerMetrics:
    """What /metrics exposes, in vLLM's names (vllm: -> rosellm:), in a registry of the app's own."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        gauge = lambda name, doc: Gauge(f"rosellm:{name}", doc, registry=r)   # noqa: E731
        self.running = gauge("num_requests_running", "Sequences in the running batch")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be admitted")
        self.kv_blocks_used = gauge("kv_cache_blocks_used", "KV blocks held by sequences")
        self.kv_usage = gauge("kv_cache_usage_perc", "Share of the KV blocks in use, 0 to 1")
        self.prefix_hit_rate = gauge("prefix_cache_hit_rate", "Share of new prompts' tokens found cached")
        histogram = lambda name, doc: Histogram(f"rosellm:{name}", doc, buckets=LATENCY_BUCKETS,  # noqa: E731
                                                registry=r)
        self.ttft = histogram("time_to_first_token_seconds", "Request arrival to its first token")
        self.tpot = histogram("time_per_output_token_seconds", "Mean gap between a request's later tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "Request arrival to its last token")
        self.prompt_tokens = Counter("rosellm:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("rosellm:generation_tokens", "Generated tokens", registry=r)

    def engine_stats(self, stats: dict) -> None:
        used = stats["total_blocks"] - stats["free_blocks"]
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_blocks_used.set(used)
        self.kv_usage.set(used / stats["total_blocks"])
        self.prefix_hit_rate.set(stats["prefix_hit_rate"])


# notebooks/07a_server_hardening.ipynb, cell 10
def engine_stats(engine) -> dict:
    """Run in the engine thread (AsyncLLMEngine.call): the scheduler's queues and the KV cache's blocks."""
    return {"running": len(engine.scheduler.running), "waiting": len(engine.scheduler.waiting),
            **engine.kv_cache_stats()}


# notebooks/07a_server_hardening.ipynb, cell 11
@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(raw: Request) -> Response:
    """Prometheus' text format. The engine's numbers are read in its own thread, between two steps."""
    state = raw.app.state
    if state.engine.errored is None:
        state.metrics.engine_stats(await state.engine.call(engine_stats))
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# notebooks/07a_server_hardening.ipynb, cell 14
@router.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
async def tokenize(body: TokenizeRequest, raw: Request) -> JSONResponse:
    """vLLM's /tokenize: a prompt's token ids, or chat messages' through the chat template."""
    check_model(raw, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise OpenAIError(400, "give either prompt or messages", "prompt")
    if body.messages is not None:
        ids = await in_pool(raw, chat_prompt_ids, [m.for_template() for m in body.messages],
                            body.add_generation_prompt)
    else:
        ids = await in_pool(raw, lambda tok, text: tok(text, add_special_tokens=body.add_special_tokens).input_ids,
                            body.prompt)
    strs = [raw.app.state.tokenizer.convert_ids_to_tokens(t) for t in ids] if body.return_token_strs else None
    return JSONResponse(TokenizeResponse(count=len(ids), max_model_len=raw.app.state.engine.engine.max_model_len,
                                         tokens=ids, token_strs=strs).model_dump())


# notebooks/07a_server_hardening.ipynb, cell 14
@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
async def detokenize(body: DetokenizeRequest, raw: Request) -> JSONResponse:
    check_model(raw, body.model)
    vocab = raw.app.state.engine.engine.vocab_size
    if not all(0 <= t < vocab for t in body.tokens):
        raise OpenAIError(400, f"tokens: token ids must be in [0, {vocab})", "tokens")
    text = await in_pool(raw, lambda tok, ids: tok.decode(ids), body.tokens)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump())


# notebooks/07a_server_hardening.ipynb, cell 17
def build_app(engine: AsyncLLMEngine, model_name: str, max_body_bytes: int = 4 * 2**20) -> FastAPI:
    app = FastAPI(title="rosellm-edu: an OpenAI-compatible server")
    app.state.engine, app.state.model_name = engine, model_name
    # Tokenizing and chat templates run in this pool, with its own copy of the tokenizer: never in the event
    # loop (it would stall every stream) nor in the engine thread (it would stall every step).
    app.state.tokenizer = copy.deepcopy(engine.engine.tokenizer)
    app.state.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
    app.state.metrics = ServerMetrics()
    app.include_router(router)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(EngineDeadError, engine_dead)
    app.add_exception_handler(Exception, server_error)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.openapi = lambda: openapi_schema(app)
    return app


# notebooks/07_serving.ipynb, cell 58
async def in_pool(raw: Request, fn: Callable, *args):
    """fn(tokenizer, *args) in the tokenizer pool, awaited without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(raw.app.state.pool, fn, raw.app.state.tokenizer, *args)


# notebooks/07_serving.ipynb, cell 59
@router.get("/health", response_class=Response,
            responses={200: {"description": "the engine loop runs"}, 503: ERRORS[503]})
async def health(raw: Request) -> Response:
    """200 while the engine loop runs; 503 once it has stopped, so that a load balancer stops sending."""
    errored = raw.app.state.engine.errored
    if errored is None:
        return Response(status_code=200)
    return OpenAIError(503, str(errored), type="server_error").response()


# notebooks/07_serving.ipynb, cell 59
@router.get("/v1/models", response_model=ModelList)
async def show_models(raw: Request) -> JSONResponse:
    name, engine = raw.app.state.model_name, raw.app.state.engine.engine
    card = ModelCard(id=name, root=name, max_model_len=engine.max_model_len)
    return JSONResponse(ModelList(data=[card]).model_dump())


# notebooks/07_serving.ipynb, cell 59
def check_model(raw: Request, model: str | None) -> None:
    served = raw.app.state.model_name
    if model is not None and model != served:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves {served!r}", "model",
                          "model_not_found")


# notebooks/07_serving.ipynb, cell 61
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


# notebooks/07_serving.ipynb, cell 61
def _concat(a: list | None, b: list | None) -> list | None:
    return None if a is None and b is None else (a or []) + (b or [])


# notebooks/07_serving.ipynb, cell 61
def sse(event: BaseModel) -> str:
    """One server-sent event: a `data:` line with the JSON, then a blank line."""
    return f"data: {event.model_dump_json()}\n\n"


# notebooks/07_serving.ipynb, cell 62
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

    # notebooks/07a_server_hardening.ipynb, cell 11
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


# notebooks/07_serving.ipynb, cell 63
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


# notebooks/07_serving.ipynb, cell 65
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


# notebooks/07_serving.ipynb, cell 65
def event_stream(raw: Request, request_id: str, n: int, events: AsyncIterator[str]) -> StreamingResponse:
    # When the client goes away, Starlette cancels the body iterator, and the engine aborts the requests; the
    # background abort also covers a client that left before the first chunk (a no-op once they finished).
    ids = [f"{request_id}-{i}" for i in range(n)]
    return StreamingResponse(events, media_type="text/event-stream",
                             background=BackgroundTask(raw.app.state.engine.abort, ids))


# notebooks/07_serving.ipynb, cell 65
async def collect(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> list[Piece]:
    """A whole response: every choice's pieces joined, in choice order."""
    choices: dict[int, Piece] = {}
    async for i, out in outputs:
        for piece in state.pieces(i, out):
            choices[piece.index] = choices[piece.index] + piece if piece.index in choices else piece
    state.finished()
    return [choices[index] for index in sorted(choices)]


# notebooks/07_serving.ipynb, cell 66
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


# notebooks/07_serving.ipynb, cell 66
async def whole_response(raw: Request, state: ResponseState,
                         outputs: AsyncIterator[tuple[int, RequestOutput]]) -> list[Piece] | None:
    """Every choice's pieces; None if the client left. A failed request is a 500, a dead engine a 503."""
    try:
        return await until_disconnected(raw, collect(state, outputs))
    except RequestFailedError as e:
        raise OpenAIError(500, str(e), type="server_error") from e


# notebooks/07_serving.ipynb, cell 68
def encode_prompts(tokenizer, prompts: list[str | list[int]], echo: bool) -> list[tuple[str | None, list[int]]]:
    """(text, token ids) of each prompt; token-id prompts get their text only when it is echoed."""
    if echo and not all(0 <= t < len(tokenizer) for p in prompts if not isinstance(p, str) for t in p):
        raise OpenAIError(400, f"prompt: token ids must be integers in [0, {len(tokenizer)})", "prompt")
    return [(p, tokenizer(p).input_ids) if isinstance(p, str) else (tokenizer.decode(p) if echo else None, p)
            for p in prompts]


# notebooks/07_serving.ipynb, cell 68
def chat_prompt_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                             return_dict=True)["input_ids"]
    except Exception as e:   # the template's own refusal (roles out of order) says what is wrong; others do not
        why = str(e) if type(e).__name__ == "TemplateError" else "the conversation could not be formatted"
        raise OpenAIError(400, f"messages: the model's chat template failed: {why}", "messages") from e


# notebooks/07_serving.ipynb, cell 68
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


# notebooks/07_serving.ipynb, cell 69
def sampling_params(raw: Request, body: SamplingRequest, max_tokens: int, logprobs: int | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The request's SamplingParams; token ids it names (logit_bias, stop_token_ids) must be in the vocabulary,
    or a step would fail on them."""
    try:
        params = body.to_sampling_params(max_tokens, logprobs, prompt_logprobs)
    except ValueError as e:
        raise invalid_parameter(e) from e
    vocab = raw.app.state.engine.engine.vocab_size
    for name, ids in [("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)]:
        if not all(0 <= t < vocab for t in ids):
            raise OpenAIError(400, f"{name}: token ids must be in [0, {vocab})", name)
    return params


# notebooks/07_serving.ipynb, cell 69
async def add_requests(raw: Request, request_id: str, prompts: list[tuple[str | None, list[int]]],
                       params: list[SamplingParams]) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per prompt (ids request_id-0, -1, ...): all of them are added, or none."""
    engine, streams = raw.app.state.engine, []
    try:
        for i, ((text, ids), p) in enumerate(zip(prompts, params)):
            streams.append(await engine.add_request(f"{request_id}-{i}", {"prompt": text, "prompt_token_ids": ids}, p))
    except BaseException as e:
        await engine.abort([f"{request_id}-{j}" for j in range(len(streams))])
        if isinstance(e, ValueError):   # refused by the engine (a KV cache too small for it): no internal ids
            message = re.sub(r"request '[^']*'", "the request", re.sub(r"^request '[^']*': ", "", str(e)))
            raise OpenAIError(400, message) from e
        raise
    return streams


# notebooks/07_serving.ipynb, cell 71
def clamp(logprob: float) -> float:
    return max(logprob, -9999.0)   # JSON has no -inf (OpenAI and vLLM clamp the same way)


# notebooks/07_serving.ipynb, cell 71
def token_text(tokenizer, token: int, entry: Logprob | None) -> str:
    return entry.decoded_token if entry is not None and entry.decoded_token is not None else tokenizer.decode([token])


# notebooks/07_serving.ipynb, cell 71
def completion_logprobs(tokenizer, piece: Piece) -> CompletionLogprobs:
    """OpenAI's legacy shape: per token its text, logprob, top alternatives ({text: logprob}) and offset."""
    out, offset = CompletionLogprobs(), piece.offset
    for token, entries in zip(piece.token_ids, piece.logprobs):
        text = token_text(tokenizer, token, entries and entries.get(token))
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        out.token_logprobs.append(None if entries is None else clamp(entries[token].logprob))
        out.top_logprobs.append(None if entries is None else
                                {token_text(tokenizer, t, e): clamp(e.logprob) for t, e in entries.items()})
    return out


# notebooks/07_serving.ipynb, cell 71
def chat_logprobs(tokenizer, piece: Piece, top: int) -> ChatLogprobs:
    """OpenAI's chat shape: per token {token, logprob, bytes, top_logprobs: the `top` most likely}."""
    def entry(token: int, e: Logprob) -> dict:
        text = token_text(tokenizer, token, e)
        return {"token": text, "logprob": clamp(e.logprob), "bytes": list(text.encode())}

    content = []
    for token, entries in zip(piece.token_ids, piece.logprobs):
        ranked = sorted((e.rank, t) for t, e in entries.items() if e.rank is not None and e.rank <= top)
        content.append(ChatLogprob(**entry(token, entries[token]),
                                   top_logprobs=[TopLogprob(**entry(t, entries[t])) for _, t in ranked]))
    return ChatLogprobs(content=content)


# notebooks/07_serving.ipynb, cell 73
@router.post("/v1/completions", response_model=CompletionResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    check_model(raw, body.model)
    check_fields(body)
    batch = body.prompts()
    prompts = await in_pool(raw, encode_prompts, batch, body.echo)
    echo_logprobs = body.logprobs if body.echo else None
    params = [sampling_params(raw, body, check_prompt(raw, ids, body.max_tokens, "prompt"), body.logprobs,
                              echo_logprobs) for _, ids in prompts]
    request_id, created = random_id("cmpl"), int(time.time())
    state = ResponseState(raw, body, prompts, echo=body.echo)
    outputs = merge(await add_requests(raw, request_id, prompts, params))

    def choice(piece: Piece) -> CompletionChoice:
        logprobs = None if body.logprobs is None else completion_logprobs(raw.app.state.tokenizer, piece)
        return CompletionChoice(index=piece.index, text=piece.text, logprobs=logprobs,
                                finish_reason=piece.finish_reason, **(piece.mask or {}))

    def response(choices: list[CompletionChoice], **kw) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        return event_stream(raw, request_id, len(batch), stream_events(
            state, outputs, lambda piece: response([choice(piece)]), lambda u: response([], usage=u)))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)   # nobody is listening
    return JSONResponse(response([choice(p) for p in pieces], usage=state.usage()).model_dump())


# notebooks/07_serving.ipynb, cell 74
async def chat_events(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]],
                      make_chunk: Callable[..., ChatCompletionChunk], logprobs) -> AsyncIterator[str]:
    """A streamed chat completion's events: each choice's role first, then one delta per step."""
    def delta_chunk(piece: Piece) -> ChatCompletionChunk:
        delta = DeltaMessage(content=piece.text) if piece.text else DeltaMessage()   # OpenAI's last delta is {}
        return make_chunk([ChatChunkChoice(index=piece.index, delta=delta, finish_reason=piece.finish_reason,
                                           logprobs=logprobs(piece), **(piece.mask or {}))])

    for index in range(state.body.n):
        yield sse(make_chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))]))
    async for event in stream_events(state, outputs, delta_chunk, lambda u: make_chunk([], usage=u)):
        yield event


# notebooks/07_serving.ipynb, cell 75
@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    check_model(raw, body.model)
    check_fields(body)
    for message in body.messages:
        check_fields(message)
    ids = await in_pool(raw, chat_prompt_ids, [m.for_template() for m in body.messages])
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = sampling_params(raw, body, check_prompt(raw, ids, max_tokens, "messages"), body.sampling_logprobs())
    request_id, created = random_id("chatcmpl"), int(time.time())
    state = ResponseState(raw, body, [(None, ids)])
    outputs = merge(await add_requests(raw, request_id, [(None, ids)], [params]))
    logprobs = lambda piece: (None if not body.logprobs else   # noqa: E731
                              chat_logprobs(raw.app.state.tokenizer, piece, body.top_logprobs or 0))

    def chunk(choices: list[ChatChunkChoice], **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        return event_stream(raw, request_id, 1, chat_events(state, outputs, chunk, logprobs))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)
    choices = [ChatChoice(index=p.index, message=ChatMessageOut(content=p.text), finish_reason=p.finish_reason,
                          logprobs=logprobs(p), **(p.mask or {})) for p in pieces]
    return JSONResponse(ChatCompletionResponse(id=request_id, created=created, model=body.model, choices=choices,
                                               usage=state.usage()).model_dump())
