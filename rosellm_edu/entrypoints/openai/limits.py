# Generated from notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass

from starlette.exceptions import HTTPException

from rosellm_edu.entrypoints.openai.errors import OpenAIError


# notebooks/07a_server_hardening.ipynb, cell 6
@dataclass(frozen=True)
class ServerLimits:
    """Every limit the server applies to a request, each with its `rosellm-edu serve` flag."""
    max_body_bytes: int = 4 * 2**20     # --max-request-body-bytes: a larger body is a 413, before parsing
    max_step_seconds: float = 60.0      # --max-step-seconds: a step running longer makes /health a 503


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
