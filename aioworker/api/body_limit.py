"""The request body, bounded in size and in time before any route sees it: a raw ASGI layer that
reads it whole (a body longer than `api.max_body_bytes` is refused with 413, from its
Content-Length before a byte of it is read when it has one; one that has not arrived within
`api.body_timeout_s` with 408) and hands the route the body it read."""

from __future__ import annotations

import asyncio

from aioworker.api.asgi import App, Message, Receive, Scope, Send, send_error
from aioworker.api.errors import ApiError


class ClientLeft(Exception):
    """The connection closed before the whole body arrived: there is nobody to answer."""


class BoundedBody:
    def __init__(self, app: App, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        try:
            body = await self.read(scope, receive)
        except ApiError as error:
            await send_error(send, error)
            return
        except ClientLeft:
            return
        await self.app(scope, replaying(body, receive), send)

    async def read(self, scope: Scope, receive: Receive) -> bytes:
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            raise too_large(f"its Content-Length is {declared}", self.max_bytes)
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._read_into(chunks, receive)
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {self.timeout_s:g}s "
                f"({sum(map(len, chunks))} bytes came); send it whole, without pauses",
                error_type="timeout_error",
            ) from None
        return b"".join(chunks)

    async def _read_into(self, chunks: list[bytes], receive: Receive) -> None:
        num_bytes = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientLeft
            chunk = message.get("body", b"")
            if num_bytes + len(chunk) > self.max_bytes:
                raise too_large(f"more than {self.max_bytes} bytes came", self.max_bytes)
            num_bytes += len(chunk)
            chunks.append(chunk)
            more = message.get("more_body", False)


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses such a head before we see it
    return None


def too_large(what: str, max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is too large: {what}; this server takes at most {max_bytes} bytes "
        "(api.max_body_bytes)",
        error_type="invalid_request_error",
    )


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then what the connection says next (its
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
