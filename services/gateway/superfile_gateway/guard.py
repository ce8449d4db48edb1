"""The outermost layer of every request: the body size limit (413) and the request counter by status.

A pure ASGI middleware (no per-request task or body copy on the common path):
a declared ``Content-Length`` over the limit is refused before the app runs;
a chunked body is buffered up to the limit and refused as soon as it passes it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import Counter

__all__ = ["Guard", "InFlight", "replay"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InFlight:
    """HTTP requests being handled now (only the event loop thread changes it: no lock)."""

    def __init__(self) -> None:
        self.count = 0


class Guard:
    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, requests: Counter, errors: Counter, inflight: InFlight
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.requests = requests
        self.errors = errors
        self.inflight = inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        self.inflight.count += 1

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            declared = _content_length(scope)
            if declared is not None and declared > self.max_body_bytes:
                status = await self._too_large(send, declared)
                return
            if declared is None and scope["method"] in ("POST", "PUT", "PATCH"):
                body, more = await self._buffer(receive)
                if more:
                    status = await self._too_large(send, None)
                    return
                receive = replay(body, receive)
            await self.app(scope, receive, counted)
        finally:
            self.inflight.count -= 1
            route = scope.get("route")
            self.requests.labels(
                method=scope["method"], route=getattr(route, "path", "unmatched"), status=str(status)
            ).inc()

    async def _buffer(self, receive: Receive) -> tuple[bytes, bool]:
        """The whole body, or what was read when it passed the limit (and True)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _too_large(self, send: Send, declared: int | None) -> int:
        size = f"{declared} bytes" if declared is not None else "the streamed body"
        message = f"request body too large: {size}, the limit is {self.max_body_bytes} bytes; nothing was written"
        body = json.dumps({"error": {"type": "PayloadTooLargeError", "message": message}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.errors.labels(type="PayloadTooLargeError").inc()
        return 413


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def replay(body: bytes, upstream: Receive) -> Receive:
    """The buffered body as one message, then the connection's own messages (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()

    return receive
