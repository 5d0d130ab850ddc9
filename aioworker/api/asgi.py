"""The ASGI types the raw layers in front of the routes use, and an error sent as a whole
response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aioworker.api.errors import ApiError

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_error(send: Send, error: ApiError) -> None:
    """The error as a whole response that also closes the connection: what is left of a body on
    it cannot be read as the next request's head."""
    body = error.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *[(k.lower().encode(), v.encode()) for k, v in error.headers.items()],
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
