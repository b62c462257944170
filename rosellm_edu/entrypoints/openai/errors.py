# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rosellm_edu.engine.async_llm_engine import EngineDeadError
from rosellm_edu.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, OpenAIBaseModel, unimplemented_fields


# notebooks/07_serving.ipynb, cell 61
logger = logging.getLogger("rosellm_edu.server")


# notebooks/07_serving.ipynb, cell 61
class OpenAIError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error body that says why."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.info).model_dump(), status_code=self.status,
                            headers=self.headers)


# notebooks/07_serving.ipynb, cell 61
ERRORS = {status: {"model": ErrorResponse, "description": why} for status, why in [
    (400, "the request is invalid"), (404, "no such model"), (413, "the body is too large"),
    (500, "the engine failed this request"), (503, "the engine has stopped")]}


# notebooks/07_serving.ipynb, cell 63
def invalid_parameter(e: ValueError) -> OpenAIError:
    """SamplingParams names the field it refuses ("SamplingParams.top_p must be ..."): that is the param."""
    name = str(e).removeprefix("SamplingParams.").split(" ")[0] if str(e).startswith("SamplingParams.") else None
    return OpenAIError(400, str(e).removeprefix("SamplingParams."), name)


# notebooks/07_serving.ipynb, cell 63
def check_fields(body: OpenAIBaseModel) -> None:
    """vLLM's rule for fields we do not implement: at their no-op value, accepted and logged; else a 400."""
    ignored, refused = unimplemented_fields(body)
    if ignored:
        logger.warning("ignoring fields this server does not implement (at their no-op values): %s", ignored)
    if refused:
        raise OpenAIError(400, f"{', '.join(refused)}: not supported by this server", refused[0])


# notebooks/07_serving.ipynb, cell 64
async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


# notebooks/07a_server_hardening.ipynb, cell 4
def from_validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first thing pydantic found wrong with the body, in OpenAI's form. A field of several types (a prompt:
    text, token ids, or a batch of either) gets one complaint per type: the one that got furthest speaks."""
    errors = exc.errors()
    if errors[0]["type"] == "json_invalid":
        return OpenAIError(400, f"the request body is not valid JSON ({errors[0]['ctx']['error']})")
    same_field = [e for e in errors if e["loc"][:2] == errors[0]["loc"][:2]]
    error = min(same_field, key=lambda e: (e["type"].endswith("_type"), -len(e["loc"])))
    param = ".".join(str(part) for part in error["loc"][1:] if not union_tag(part)) or None   # loc[0] is "body"
    message = error["msg"].removeprefix("Value error, ")
    return OpenAIError(400, f"{param}: {message}" if param else f"request body: {message}", param)


# notebooks/07a_server_hardening.ipynb, cell 5
def union_tag(part: str | int) -> bool:
    """pydantic names the member of a union in the error's loc ("list[int]", "constrained-str"): not a field."""
    return isinstance(part, str) and (not part.isidentifier() or part in ("str", "int", "float", "bool"))


# notebooks/07a_server_hardening.ipynb, cell 5
async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_error(exc).response()


# notebooks/07a_server_hardening.ipynb, cell 5
async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # an unknown route, a wrong method (its Allow header kept), a body too large
    return OpenAIError(exc.status_code, str(exc.detail), headers=exc.headers).response()


# notebooks/07a_server_hardening.ipynb, cell 5
async def engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:
    return OpenAIError(503, str(exc), type="server_error").response()


# notebooks/07a_server_hardening.ipynb, cell 5
async def server_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("internal error", exc_info=exc)   # the details go to the log, not to the client
    # Starlette closes the connection after this answer: Connection: close tells the client to open a new one
    return OpenAIError(500, f"internal server error ({type(exc).__name__})", type="server_error",
                       headers={"Connection": "close"}).response()
