"""What a client sent and what the server answered, kept for every refused or failed request.

`Recorder` is plain ASGI middleware around the app under test: it changes nothing in the exchange, it only keeps a
copy of each request body whose response was not a 2xx, so that a client's failure names the exact request and the
server's answer instead of the client's own summary of it ("400 Bad Request")."""

from dataclasses import dataclass, field


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    status: int = 0
    response: bytes = b""

    def __str__(self) -> str:
        def show(body: bytes, limit: int) -> str:
            text = body.decode("utf-8", "replace")
            return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"
        return f"{self.method} {self.path} {show(self.request, 1500)}\n  -> {self.status} {show(self.response, 800)}"


@dataclass
class Recorder:
    app: object
    failed: list[Exchange] = field(default_factory=list)
    max_response_bytes: int = 4096

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        exchange = Exchange(scope["method"], scope["path"], b"")

        async def receive_and_keep():
            message = await receive()
            if message["type"] == "http.request":
                exchange.request += message.get("body", b"")
            return message

        async def send_and_keep(message):
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                if not 200 <= exchange.status < 300:
                    self.failed.append(exchange)
            elif message["type"] == "http.response.body" and len(exchange.response) < self.max_response_bytes:
                exchange.response += message.get("body", b"")
            await send(message)

        await self.app(scope, receive_and_keep, send_and_keep)

    def since(self, mark: int) -> str:
        """The failed exchanges after `mark` (a len(self.failed) taken before), one per paragraph."""
        return "\n".join(str(e) for e in self.failed[mark:]) or "(the server refused nothing)"

