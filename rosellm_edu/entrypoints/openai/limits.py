# Generated from notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import hmac
from dataclasses import dataclass

from starlette.exceptions import HTTPException

from rosellm_edu.entrypoints.openai.errors import OpenAIError
from rosellm_edu.entrypoints.openai.protocol import OpenAIBaseModel, SamplingRequest, strings


# notebooks/07a_server_hardening.ipynb, cell 7
@dataclass(frozen=True)
class ServerLimits:
    """Every limit the server applies to a request, each with its `rosellm-edu serve` flag."""
    max_body_bytes: int = 4 * 2**20      # --max-request-body-bytes: a larger body is a 413, before parsing
    max_prompt_chars: int = 1_000_000    # --max-prompt-chars: a request's text, counted before tokenizing
    max_n: int = 16                      # --max-n: choices per request
    max_logit_bias: int = 300            # --max-logit-bias: entries of logit_bias (OpenAI's limit)
    tokenizer_workers: int = 2           # --tokenizer-workers: threads tokenizing requests of ordinary size
    max_step_seconds: float = 60.0       # --max-step-seconds: a step running longer makes /health a 503

    def __post_init__(self):
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"ServerLimits.{name} must be positive, got {value}")

    def check(self, body: OpenAIBaseModel) -> None:
        """A 400 that names the field, the limit and its flag, before any work is done for the request."""
        chars = {name: sum(len(text) for text in strings(value)) for name, value in body if name != "model"}
        if sum(chars.values()) > self.max_prompt_chars:
            raise over(max(chars, key=chars.get), f"the request's text is {sum(chars.values())} characters",
                       self.max_prompt_chars, "--max-prompt-chars")
        if isinstance(body, SamplingRequest) and body.n > self.max_n:
            raise over("n", f"{body.n} choices", self.max_n, "--max-n")
        if isinstance(body, SamplingRequest) and len(body.logit_bias or {}) > self.max_logit_bias:
            raise over("logit_bias", f"{len(body.logit_bias)} entries", self.max_logit_bias, "--max-logit-bias")

    # notebooks/07a_server_hardening.ipynb, cell 10
    def declare(self, schemas: dict) -> None:
        """Write the limits into the OpenAPI schema's request models, as constraints on their fields."""
        def members(field: dict) -> list[dict]:
            return field.get("anyOf", [field])

        for model in schemas.values():
            fields = model.get("properties", {})
            if "n" in fields:
                fields["n"]["maximum"] = self.max_n
            for member in members(fields.get("logit_bias", {})):
                if member.get("type") == "object":
                    member["maxProperties"] = self.max_logit_bias
            for member in members(fields.get("prompt", {})) + members(fields.get("content", {})):
                text = member if member.get("type") == "string" else member.get("items", {})
                if text.get("type") == "string":
                    text["maxLength"] = self.max_prompt_chars


# notebooks/07a_server_hardening.ipynb, cell 7
def over(param: str, what: str, limit: int, flag: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {what}, over this server's limit of {limit} (rosellm-edu serve {flag})",
                       param)


# notebooks/07a_server_hardening.ipynb, cell 8
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


# notebooks/07a_server_hardening.ipynb, cell 20
class ApiKey:
    """ASGI middleware: every /v1 route needs `Authorization: Bearer <key>`; the others stay open (vLLM's rule)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization")
            if given is None or not hmac.compare_digest(given, self.expected):
                why = "no API key: send `Authorization: Bearer <key>`" if given is None else "incorrect API key"
                refused = OpenAIError(401, f"{why} (rosellm-edu serve --api-key, or ROSELLM_API_KEY)",
                                      code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                return await refused.response()(scope, receive, send)
        await self.app(scope, receive, send)
