"""A request's stream on the client (wire/request_stream.py): it ends after the terminal output
of its last open sample, or at once on an error, and `ready` takes only what has arrived."""

from __future__ import annotations

import asyncio

from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.wire.request_stream import RequestStream


def _out(sample: int, finish: FinishReason | None = None) -> RequestOutput:
    return RequestOutput("r", [sample], finish_reason=finish, sample_index=sample)


def _stream(outs: list[RequestOutput], n: int) -> RequestStream:
    queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
    for out in outs:
        queue.put_nowait(out)
    return RequestStream("r", group=0, queue=queue, n=n)


async def _collect(stream: RequestStream) -> list[RequestOutput]:
    return [out async for out in stream]


def test_the_stream_ends_with_its_last_samples_terminal_output() -> None:
    later = _out(0)  # queued after the end: never taken
    outs = [_out(0), _out(1, FinishReason.LENGTH), _out(0), _out(0, FinishReason.STOP), later]
    assert asyncio.run(_collect(_stream(outs, n=2))) == outs[:4]


def test_an_error_ends_every_sample_at_once() -> None:
    outs = [_out(0), _out(1, FinishReason.ERROR), _out(0)]
    assert asyncio.run(_collect(_stream(outs, n=2))) == outs[:2]


def test_ready_takes_what_has_arrived_and_stops_at_the_end() -> None:
    outs = [_out(0), _out(0, FinishReason.STOP), _out(0)]
    stream = _stream(outs[:1], n=1)
    assert stream.ready() == outs[:1]
    assert stream.ready() == []  # nothing more has arrived: no wait
    stream._queue.put_nowait(outs[1])
    stream._queue.put_nowait(outs[2])
    assert stream.ready() == outs[1:2]  # the end, and nothing after it
