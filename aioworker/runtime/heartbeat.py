"""Heartbeats come from the loop, on a timer, whatever the executor is doing: a rank in a long
prefill or a weight load still beats, and says how long its current step has run."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import zmq
import zmq.asyncio

from aioworker.runtime.lifecycle import RankLifecycle
from aioworker.runtime.progress import StepProgress
from aioworker.wire.health import FINAL_STATES
from aioworker.wire.protocol import Heartbeat, encode


class ServingInfo(NamedTuple):
    """What the rank's role reports in its beats: queue depths, KV blocks, weights version."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    weights_version: int = 0


class HeartbeatSource:
    """Makes this rank's beats: its state, step, queue depths and token rate since the last."""

    def __init__(
        self,
        group: int,
        rank: int,
        interval_s: float,
        lifecycle: RankLifecycle,
        progress: StepProgress,
        serving_info: Callable[[], ServingInfo],
    ) -> None:
        self.group, self.rank, self.interval_s = group, rank, interval_s
        self.lifecycle = lifecycle
        self.progress = progress
        self.serving_info = serving_info
        self._tokens = 0
        self._time = time.monotonic()

    def make(self) -> Heartbeat:
        now = time.monotonic()
        elapsed, generated = now - self._time, self.progress.num_tokens_generated
        rate = (generated - self._tokens) / elapsed if elapsed > 0 else 0.0
        self._time, self._tokens = now, generated
        info = self.serving_info()
        return Heartbeat(
            group=self.group,
            rank=self.rank,
            pid=os.getpid(),
            state=str(self.lifecycle.state),
            step_id=self.progress.step_id,
            step_elapsed_s=self.progress.step_age(now),
            num_running=info.num_running,
            num_waiting=info.num_waiting,
            kv_blocks_used=info.kv_blocks_used,
            kv_blocks_total=info.kv_blocks_total,
            tokens_per_s=rate,
            weights_version=info.weights_version,
            interval_s=self.interval_s,
            sent_at=time.time(),
            detail=self.lifecycle.detail,
        )

    async def publish(self, sock: zmq.asyncio.Socket) -> None:
        """Beat every interval until the rank's state is final."""
        while True:
            beat = self.make()
            try:
                await sock.send_multipart(encode(beat), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # no subscriber keeps up: a beat is worth nothing late
            if beat.state in FINAL_STATES:
                return
            await asyncio.sleep(self.interval_s)
