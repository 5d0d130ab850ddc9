"""A client that leaves cancels its handler; one that stays does not; a cancellation from
elsewhere (shutdown) is not mistaken for a disconnect."""

from __future__ import annotations

import asyncio

import pytest

from aioworker.api.disconnect import ClientDisconnected, cancelled_on_disconnect
from aioworker.api.errors import from_output
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput


def receiver(disconnect_after: float | None):
    async def receive() -> dict:
        if disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    return receive


def test_a_disconnect_cancels_the_block() -> None:
    reached_end = False

    async def handler() -> None:
        nonlocal reached_end
        async with cancelled_on_disconnect(receiver(0.01)):
            await asyncio.sleep(10)
            reached_end = True

    with pytest.raises(ClientDisconnected):
        asyncio.run(asyncio.wait_for(handler(), 5))
    assert not reached_end


def test_a_block_that_finishes_is_left_alone() -> None:
    async def handler() -> str:
        async with cancelled_on_disconnect(receiver(None)):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)  # no stray cancellation afterwards
        return "done"

    assert asyncio.run(handler()) == "done"


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def main() -> None:
        async def handler() -> None:
            async with cancelled_on_disconnect(receiver(None)):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(handler())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (ErrorKind.INVALID, 400),
        (ErrorKind.OVERLOADED, 429),
        (ErrorKind.UNAVAILABLE, 503),
        (ErrorKind.INTERNAL, 500),
        (None, 500),
    ],
)
def test_error_kinds_become_http_statuses(kind, status: int) -> None:
    error = from_output(RequestOutput("r", [], FinishReason.ERROR, "why", error_kind=kind), 2)
    assert error.status == status and error.message == "why"
    assert error.headers == ({"Retry-After": "2"} if status == 429 else {})


def test_an_abort_in_the_worker_is_a_503() -> None:
    error = from_output(RequestOutput("r", [], FinishReason.ABORT, "drain deadline"), 1)
    assert error.status == 503 and "drain deadline" in error.message
