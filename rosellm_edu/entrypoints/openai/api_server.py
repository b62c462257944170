# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import copy
import threading
import time
from typing import AsyncIterator, Awaitable, Callable

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.entrypoints.openai.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                                     ChatCompletionRequest, ChatCompletionResponse, ChatMessageOut,
                                                     CompletionChoice, CompletionRequest, CompletionResponse,
                                                     DeltaMessage, ErrorInfo, ErrorResponse, ModelCard, ModelList,
                                                     SamplingRequest, UsageInfo, random_id)
from rosellm_edu.outputs import CompletionOutput, RequestOutput
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.streaming import DeltaTracker


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


# notebooks/07_serving.ipynb, cell 43
router = APIRouter()


# notebooks/07_serving.ipynb, cell 43
class OpenAIError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error body that says why."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.info).model_dump(), status_code=self.status)


# notebooks/07_serving.ipynb, cell 45
def from_validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first thing pydantic found wrong with the body, in OpenAI's form."""
    error = exc.errors()[0]
    if error["type"] == "json_invalid":
        return OpenAIError(400, f"the request body is not valid JSON ({error['ctx']['error']})")
    param = ".".join(str(part) for part in error["loc"][1:]) or None   # loc starts with "body"
    if error["type"] == "extra_forbidden":
        return OpenAIError(400, f"{param}: not supported by this server", param)
    message = error["msg"].removeprefix("Value error, ")
    return OpenAIError(400, f"{param}: {message}" if param else f"request body: {message}", param)


# notebooks/07_serving.ipynb, cell 45
def invalid_parameter(e: ValueError) -> OpenAIError:
    """SamplingParams names the field it refuses ("SamplingParams.top_p must be ..."): that is the param."""
    name = str(e).removeprefix("SamplingParams.").split(" ")[0] if str(e).startswith("SamplingParams.") else None
    return OpenAIError(400, str(e), name)


# notebooks/07_serving.ipynb, cell 45
async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


# notebooks/07_serving.ipynb, cell 45
async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_error(exc).response()


# notebooks/07_serving.ipynb, cell 45
async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return OpenAIError(exc.status_code, str(exc.detail)).response()   # unknown route, wrong method


# notebooks/07_serving.ipynb, cell 45
async def server_error(request: Request, exc: Exception) -> JSONResponse:
    return OpenAIError(500, f"internal error: {exc!r}", type="server_error").response()


# notebooks/07_serving.ipynb, cell 47
def build_app(engine: AsyncLLMEngine, model_name: str) -> FastAPI:
    app = FastAPI(title="rosellm-edu: an OpenAI-compatible server")
    app.state.engine, app.state.model_name = engine, model_name
    # Our own tokenizer for chat templates: the engine thread decodes with its tokenizer at the same time.
    app.state.tokenizer = copy.deepcopy(engine.engine.tokenizer)
    app.include_router(router)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    return app


# notebooks/07_serving.ipynb, cell 47
@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


# notebooks/07_serving.ipynb, cell 47
@router.get("/v1/models")
async def show_models(raw: Request) -> JSONResponse:
    return JSONResponse(ModelList(data=[ModelCard(id=raw.app.state.model_name)]).model_dump())


# notebooks/07_serving.ipynb, cell 47
def check_model(raw: Request, model: str) -> None:
    served = raw.app.state.model_name
    if model != served:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves {served!r}", "model",
                          "model_not_found")


# notebooks/07_serving.ipynb, cell 49
def sse(event: BaseModel) -> str:
    """One server-sent event: a `data:` line with the JSON, then a blank line."""
    return f"data: {event.model_dump_json()}\n\n"


# notebooks/07_serving.ipynb, cell 49
def mask_fields(body: SamplingRequest, completion: CompletionOutput, start: int) -> dict:
    """The keep-sampling mask and logZ of the tokens from `start` on, only if the request asked for them."""
    if not body.return_sampling_mask:
        return {}
    mask = completion.sampling_mask
    return {"sampling_mask": None if mask is None else mask[start:],
            "sampling_logz": completion.sampling_logz[start:]}


# notebooks/07_serving.ipynb, cell 49
def usage(out: RequestOutput) -> UsageInfo:
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


# notebooks/07_serving.ipynb, cell 50
async def stream_events(outputs: AsyncIterator[RequestOutput], request_id: str, params: SamplingParams,
                        body: SamplingRequest, make_chunk: Callable[..., BaseModel],
                        make_usage_chunk: Callable[[UsageInfo], BaseModel]) -> AsyncIterator[str]:
    """A chunk per engine step with the request's new text, then usage if asked, then `data: [DONE]`."""
    tracker = DeltaTracker()
    tracker.add(request_id, params)
    try:
        async for out in outputs:
            text, token_ids = tracker.next(out)
            completion = out.outputs[0]
            start = len(completion.token_ids) - len(token_ids)
            yield sse(make_chunk(text, completion.finish_reason, mask_fields(body, completion, start)))
        if body.stream_options and body.stream_options.include_usage:
            yield sse(make_usage_chunk(usage(out)))
    except RuntimeError as e:   # the engine failed this request: say so in the stream, which is already open
        yield sse(ErrorResponse(error=ErrorInfo(message=str(e), type="server_error")))
    yield "data: [DONE]\n\n"


# notebooks/07_serving.ipynb, cell 50
def event_stream(raw: Request, request_id: str, events: AsyncIterator[str]) -> StreamingResponse:
    # When the client goes away, Starlette cancels the body iterator, and the engine aborts the request; the
    # background abort also covers a client that left before the first chunk (a no-op once it finished).
    return StreamingResponse(events, media_type="text/event-stream",
                             background=BackgroundTask(raw.app.state.engine.abort, request_id))


# notebooks/07_serving.ipynb, cell 52
async def add_request(raw: Request, request_id: str, prompt: str | dict,
                      params: SamplingParams) -> AsyncIterator[RequestOutput]:
    try:
        return await raw.app.state.engine.add_request(request_id, prompt, params)
    except (ValueError, TypeError) as e:   # refused by the engine: too long, bad token ids, ...
        raise OpenAIError(400, str(e)) from e


# notebooks/07_serving.ipynb, cell 52
async def final_output(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    async for out in outputs:
        pass
    return out


# notebooks/07_serving.ipynb, cell 52
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


# notebooks/07_serving.ipynb, cell 54
@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    check_model(raw, body.model)
    try:
        prompt, params = body.engine_prompt(), body.to_sampling_params(body.max_tokens)
    except ValueError as e:
        raise invalid_parameter(e) from e
    request_id, created = random_id("cmpl"), int(time.time())
    outputs = await add_request(raw, request_id, prompt, params)

    def response(choices: list[CompletionChoice], **kw) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        chunk = lambda text, finish, extra: response([CompletionChoice(text=text, finish_reason=finish, **extra)])
        return event_stream(raw, request_id, stream_events(outputs, request_id, params, body, chunk,
                                                           lambda u: response([], usage=u)))
    out = await until_disconnected(raw, final_output(outputs))
    if out is None:
        return Response(status_code=499)   # nobody is listening
    completion = out.outputs[0]
    choice = CompletionChoice(text=completion.text, finish_reason=completion.finish_reason,
                              **mask_fields(body, completion, 0))
    return JSONResponse(response([choice], usage=usage(out)).model_dump())


# notebooks/07_serving.ipynb, cell 55
async def chat_events(outputs: AsyncIterator[RequestOutput], request_id: str, created: int, params: SamplingParams,
                      body: ChatCompletionRequest) -> AsyncIterator[str]:
    """A streamed chat completion's events: the assistant's role first, then one delta per step."""
    def chunk(choices: list[ChatChunkChoice], **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, created=created, model=body.model, choices=choices, **kw)

    def delta_chunk(text: str, finish: str | None, extra: dict) -> ChatCompletionChunk:
        delta = DeltaMessage(content=text) if text else DeltaMessage()   # OpenAI's last delta is {}
        return chunk([ChatChunkChoice(delta=delta, finish_reason=finish, **extra)])

    yield sse(chunk([ChatChunkChoice(delta=DeltaMessage(role="assistant", content=""))]))
    async for event in stream_events(outputs, request_id, params, body, delta_chunk, lambda u: chunk([], usage=u)):
        yield event


# notebooks/07_serving.ipynb, cell 56
@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    check_model(raw, body.model)
    state = raw.app.state
    try:
        prompt_ids = state.tokenizer.apply_chat_template([m.model_dump() for m in body.messages], tokenize=True,
                                                         add_generation_prompt=True, return_dict=True)["input_ids"]
    except Exception as e:   # the template itself may refuse a conversation (e.g. roles out of order)
        raise OpenAIError(400, f"messages: the model's chat template failed: {e}", "messages") from e
    room = max(state.engine.engine.max_model_len - len(prompt_ids), 1)   # too long: the engine says so
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    try:
        params = body.to_sampling_params(room if max_tokens is None else max_tokens)
    except ValueError as e:
        raise invalid_parameter(e) from e
    request_id, created = random_id("chatcmpl"), int(time.time())
    outputs = await add_request(raw, request_id, {"prompt_token_ids": prompt_ids}, params)

    if body.stream:
        return event_stream(raw, request_id, chat_events(outputs, request_id, created, params, body))
    out = await until_disconnected(raw, final_output(outputs))
    if out is None:
        return Response(status_code=499)
    completion = out.outputs[0]
    choice = ChatChoice(message=ChatMessageOut(content=completion.text), finish_reason=completion.finish_reason,
                        **mask_fields(body, completion, 0))
    return JSONResponse(ChatCompletionResponse(id=request_id, created=created, model=body.model, choices=[choice],
                                               usage=usage(out)).model_dump())
