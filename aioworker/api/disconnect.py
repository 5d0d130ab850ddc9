"""Notice a client that closes its HTTP connection while its request is still running, so the
request is aborted in the workers at once instead of computing for nobody.

The ASGI server answers `receive()` with `http.disconnect` when the connection closes; a small
watcher task waits for that and cancels the handler, wherever it is waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was complete."""


@asynccontextmanager
async def cancelled_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Runs the block; if the client disconnects meanwhile, the block is cancelled and
    ClientDisconnected raised in its place. Call after the request body has been read."""
    task = asyncio.current_task()
    assert task is not None
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not gone.is_set():
            raise  # cancelled for another reason (server shutdown): not ours to swallow
        task.uncancel()
        raise ClientDisconnected from None
    finally:
        watcher.cancel()
