# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb, notebooks/07b_responses_api.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import copy

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError
from rosellm_edu.entrypoints.openai import (metrics, serving_chat, serving_completion, serving_responses,
                                            serving_tokenization)
from rosellm_edu.entrypoints.openai.errors import (ERRORS, OpenAIError, engine_dead, http_error, invalid_body,
                                                   openai_error, server_error)
from rosellm_edu.entrypoints.openai.limits import ApiKey, BodyLimit, ServerLimits
from rosellm_edu.entrypoints.openai.protocol import ModelCard, ModelList
from rosellm_edu.entrypoints.openai.serving_engine import TokenizerLanes, check_model


# notebooks/07_serving.ipynb, cell 86
router = APIRouter()   # this module's own routes: /health and /v1/models


# notebooks/07_serving.ipynb, cell 87
@router.get("/health", response_class=Response,
            responses={200: {"description": "the engine loop runs"}, 503: ERRORS[503]})
async def health(raw: Request) -> Response:
    """200 while the engine can serve; 503 saying why not, so that a load balancer stops sending."""
    problem = engine_problem(raw.app.state)
    if problem is None:
        return Response(status_code=200)
    return OpenAIError(503, problem, type="server_error").response()


# notebooks/07a_server_hardening.ipynb, cell 59
def engine_problem(state) -> str | None:
    """Why the engine cannot serve, or None: a loop that stopped, or a step running longer than max_step_seconds
    (the heartbeat: a hung step raises nothing, so only its duration can tell)."""
    engine, limit = state.engine, state.limits.max_step_seconds
    if engine.errored is not None:
        return str(engine.errored)
    running = engine.step_running_for()
    if running > limit:
        return (f"the engine's step has run for {running:.1f} s, longer than max_step_seconds={limit:g} "
                "(rosellm-edu serve --max-step-seconds)")
    return None


# notebooks/07_serving.ipynb, cell 87
@router.get("/v1/models", response_model=ModelList)
async def show_models(raw: Request) -> JSONResponse:
    name, engine = raw.app.state.model_name, raw.app.state.engine.engine
    card = ModelCard(id=name, root=name, max_model_len=engine.max_model_len)
    return JSONResponse(ModelList(data=[card]).model_dump())


# notebooks/07_serving.ipynb, cell 87
@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses={404: ERRORS[404]})
async def show_model(model_id: str, raw: Request) -> JSONResponse:
    check_model(raw, model_id)
    card = ModelCard(id=model_id, root=model_id, max_model_len=raw.app.state.engine.engine.max_model_len)
    return JSONResponse(card.model_dump())


# notebooks/07a_server_hardening.ipynb, cell 11
def openapi_schema(app: FastAPI) -> dict:
    """FastAPI's schema, corrected to say what this server really answers: a body pydantic refuses is a 400
    in OpenAI's shape (declared with ERRORS), never FastAPI's 422; the limits are the server's; with a key,
    every /v1 route declares it and its 401."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                if app.state.api_key and path.startswith("/v1"):
                    operation["security"] = [{"bearer": []}]
                    operation["responses"]["401"] = {"description": "no API key, or a wrong one", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
        components = schema.setdefault("components", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(name, None)
        app.state.limits.declare(components.get("schemas", {}))
        if app.state.api_key:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
    return app.openapi_schema


# notebooks/07b_responses_api.ipynb, cell 22
def routers() -> list[APIRouter]:
    """Every route module's router."""
    return [router, serving_completion.router, serving_chat.router, serving_tokenization.router,
            serving_responses.router, metrics.router]


# notebooks/07a_server_hardening.ipynb, cell 27
def build_app(engine: AsyncLLMEngine, model_name: str, *, api_key: str | None = None,
              limits: ServerLimits | None = None) -> FastAPI:
    app = FastAPI(title="rosellm-edu: an OpenAI-compatible server")
    app.state.engine, app.state.model_name, app.state.api_key = engine, model_name, api_key
    app.state.limits = limits = limits or ServerLimits()
    # Tokenizing and chat templates run in the lanes' threads: never in the event loop (it would stall every
    # stream) nor in the engine thread (it would stall every step). The event loop's own copy decodes tokens.
    app.state.tokenizer = copy.deepcopy(engine.engine.tokenizer)
    app.state.lanes = TokenizerLanes(engine.engine.tokenizer, limits.tokenizer_workers)
    app.state.metrics = metrics.ServerMetrics()
    for routes in routers():
        app.include_router(routes)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(EngineDeadError, engine_dead)
    app.add_exception_handler(Exception, server_error)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if api_key:   # added last, so outermost: a request without the key goes no further
        app.add_middleware(ApiKey, key=api_key)
    app.openapi = lambda: openapi_schema(app)
    return app
