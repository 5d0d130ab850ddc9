"""Heartbeats come from the loop, on a timer, whatever the executor is doing: a rank in a long
prefill or a weight load still beats, and says how long its current step has run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import zmq

from aioworker.runtime.lifecycle import RankLifecycle
from aioworker.runtime.progress import StepProgress
from aioworker.wire.protocol import Heartbeat, encode
from aioworker.wire.transport import make_socket, remove_ipc_file


class ServingInfo(NamedTuple):
    """What the rank's role reports in its beats: queue depths, KV blocks, weights version."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    weights_version: int = 0
    # Prefix caching: blocks with a content address, and prompt tokens found computed / looked up.
    kv_blocks_cached: int = 0
    prefix_hit_tokens: int = 0
    prefix_queried_tokens: int = 0
    # Once loaded (driver): the longest prompt plus output a request may have.
    max_model_len: int = 0


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
            kv_blocks_cached=info.kv_blocks_cached,
            prefix_hit_tokens=info.prefix_hit_tokens,
            prefix_queried_tokens=info.prefix_queried_tokens,
            max_model_len=info.max_model_len,
            interval_s=self.interval_s,
            sent_at=time.time(),
            detail=self.lifecycle.detail,
        )


class HeartbeatThread:
    """Publishes a rank's beats from a thread of its own, so the rank beats whatever its event
    loop is doing: a loop held up by a heavy frame must not make peers and monitors take a busy
    rank for a dead one. Binding happens at construction, so a second instance on the same
    endpoint is refused there."""

    def __init__(
        self,
        source: HeartbeatSource,
        context: zmq.Context,
        endpoint: str,
        options: Mapping[int, int | bytes] | None,
    ) -> None:
        """`context`: the rank's, so its ZAP handler guards this socket too (used here through
        a plain, thread-side view of it)."""
        self.source = source
        self.endpoint = endpoint
        self._sock = make_socket(
            zmq.Context.shadow(context.underlying), zmq.PUB, bind=endpoint, options=options
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aioworker-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Publish the final state once more, so monitors see it at once, and end the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        else:  # never started: nobody else uses the socket
            self._close()

    def _run(self) -> None:
        try:
            while True:
                self._send()
                if self._stop.wait(self.source.interval_s):
                    self._send()  # the final state
                    return
        finally:
            self._close()

    def _send(self) -> None:
        try:
            self._sock.send_multipart(encode(self.source.make()), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeps up: a beat is worth nothing late

    def _close(self) -> None:
        self._sock.close(linger=500)  # let the last beat leave
        remove_ipc_file(self.endpoint)
