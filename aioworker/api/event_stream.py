"""A server-sent-events response that knows when its reader left: the events come from an async
generator, and a disconnect closes it (its cleanup aborts the request in the workers)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.responses import Response

from aioworker.api.disconnect import ClientDisconnected, cancelled_on_disconnect

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx and its kin: do not buffer the stream
]


class EventStream(Response):
    def __init__(
        self,
        first: bytes,
        rest: AsyncGenerator[bytes, None],
        on_end: Callable[[bool], None] | None = None,
    ) -> None:
        """`first`: the events already made (the request's first output); `rest`: the others;
        `on_end(disconnected)` is called once the stream has ended either way."""
        self.status_code = 200
        self.background = None
        self.raw_headers = list(HEADERS)
        self.first = first
        self.rest = rest
        self.on_end = on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        disconnected = False
        try:
            async with cancelled_on_disconnect(receive):
                await send({"type": "http.response.body", "body": self.first, "more_body": True})
                async for event in self.rest:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientDisconnected, OSError):
            disconnected = True
        finally:
            await self.rest.aclose()
            if self.on_end is not None:
                self.on_end(disconnected)
