"""Heartbeats come from the loop, on a timer, whatever the executor is doing: a rank in a long
prefill or a weight load still beats, and says how long its current step has run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq.asyncio

from aioworker.wire.protocol import Heartbeat, encode

log = logging.getLogger(__name__)


async def publish_heartbeats(
    sock: zmq.asyncio.Socket, make_beat: Callable[[], Heartbeat], interval_s: float
) -> None:
    while True:
        beat = make_beat()
        try:
            await sock.send_multipart(encode(beat), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeps up: a beat is worth nothing late
        if beat.state in ("STOPPED", "FAILED"):
            return
        await asyncio.sleep(interval_s)
