# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import copy
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError
from rosellm_edu.entrypoints.openai import metrics, serving_chat, serving_completion, serving_tokenization
from rosellm_edu.entrypoints.openai.errors import (ERRORS, OpenAIError, engine_dead, http_error, invalid_body,
                                                   openai_error, server_error)
from rosellm_edu.entrypoints.openai.limits import BodyLimit, ServerLimits
from rosellm_edu.entrypoints.openai.protocol import ModelCard, ModelList


# notebooks/07_serving.ipynb, cell 60
router = APIRouter()   # this module's own routes: /health and /v1/models


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


# notebooks/07a_server_hardening.ipynb, cell 18
def build_app(engine: AsyncLLMEngine, model_name: str, *, limits: ServerLimits | None = None) -> FastAPI:
    app = FastAPI(title="rosellm-edu: an OpenAI-compatible server")
    app.state.engine, app.state.model_name = engine, model_name
    app.state.limits = limits = limits or ServerLimits()
    # Tokenizing and chat templates run in this pool, with its own copy of the tokenizer: never in the event
    # loop (it would stall every stream) nor in the engine thread (it would stall every step).
    app.state.tokenizer = copy.deepcopy(engine.engine.tokenizer)
    app.state.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
    app.state.metrics = metrics.ServerMetrics()
    for routes in (router, serving_completion.router, serving_chat.router, serving_tokenization.router,
                   metrics.router):
        app.include_router(routes)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(EngineDeadError, engine_dead)
    app.add_exception_handler(Exception, server_error)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.openapi = lambda: openapi_schema(app)
    return app


# notebooks/07a_server_hardening.ipynb, cell 46
@router.get("/health", response_class=Response,
            responses={200: {"description": "the engine loop runs, and no step is stuck"}, 503: ERRORS[503]})
async def health(raw: Request) -> Response:
    """200 while the engine loop runs and no step has run longer than max_step_seconds; otherwise 503, so that a
    load balancer stops sending and an orchestrator restarts the server."""
    engine, limit = raw.app.state.engine, raw.app.state.limits.max_step_seconds
    running = engine.step_running_for()
    if engine.errored is not None:
        message = str(engine.errored)
    elif running > limit:
        message = (f"the engine's step has run for {running:.1f} s, longer than max_step_seconds={limit:g} "
                   "(rosellm-edu serve --max-step-seconds)")
    else:
        return Response(status_code=200)
    return OpenAIError(503, message, type="server_error").response()


# notebooks/07_serving.ipynb, cell 61
@router.get("/v1/models", response_model=ModelList)
async def show_models(raw: Request) -> JSONResponse:
    name, engine = raw.app.state.model_name, raw.app.state.engine.engine
    card = ModelCard(id=name, root=name, max_model_len=engine.max_model_len)
    return JSONResponse(ModelList(data=[card]).model_dump())
