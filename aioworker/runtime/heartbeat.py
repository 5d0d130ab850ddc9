"""Heartbeats come from a thread, on a timer and at once on every state change, whatever the
executor is doing: a rank in a long prefill or a weight load still beats, and says how long its
current step has run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import zmq

from aioworker.core.loaded_rank import LoadedRank
from aioworker.runtime.lifecycle import RankLifecycle
from aioworker.runtime.progress import StepProgress
from aioworker.wire.protocol import Heartbeat, PeerReady, encode
from aioworker.wire.transport import make_socket, remove_ipc_file

log = logging.getLogger(__name__)

# A gap between two beats longer than this many intervals is logged: the process was starved
# (of CPU, or of the GIL by a call that holds it), and its watchers, who give up after 3
# intervals (10 while it loads: wire/health.py), came close to taking it for dead.
LATE_AFTER_INTERVALS = 2


class ServingInfo(NamedTuple):
    """What the rank's role reports in its beats: queue depths, KV blocks, weights version and
    what its weights amount to."""

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
    # Speculative decoding (driver): drafts verified, accepted, and sequences verified.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verified: int = 0
    # Once loaded (every rank): its projections' quantization, weight bytes held and read per step.
    quantization: str = ""
    weight_bytes_held: int = 0
    weight_bytes_read: int = 0
    # MoE models (every rank): its experts and the tokens routed to each (core/expert_load.py).
    expert_layout: str = ""
    expert_first: int = 0
    expert_tokens: tuple[int, ...] = ()
    expert_steps: int = 0
    expert_layers: int = 0
    # The host KV tier (driver; 0 without one): HostKvConnector.stats() under the same names.
    host_kv_blocks_total: int = 0
    host_kv_blocks_used: int = 0
    host_kv_blocks_cached: int = 0
    host_kv_hit_blocks: int = 0
    host_kv_saved_blocks: int = 0
    host_kv_swaps_out: int = 0
    host_kv_swaps_in: int = 0
    host_kv_copy_failures: int = 0
    host_kv_bytes_saved: int = 0
    host_kv_bytes_loaded: int = 0
    host_kv_ms_saving: float = 0.0
    host_kv_ms_loading: float = 0.0


# The host tier's figures, named alike in ServingInfo, Heartbeat and `admin status`.
HOST_KV_FIELDS = tuple(name for name in ServingInfo._fields if name.startswith("host_kv_"))


def host_kv_info(info: ServingInfo) -> dict[str, Any]:
    """The host tier's figures of `info` (all 0 without a tier)."""
    return {name: getattr(info, name) for name in HOST_KV_FIELDS}


def expert_info(loaded: LoadedRank | None) -> dict[str, Any]:
    """The fields of a rank's expert load, as ServingInfo and Heartbeat name them (none for a
    dense model)."""
    if loaded is None or loaded.expert_load is None:
        return {}
    load = loaded.expert_load()
    return {
        "expert_layout": load.layout,
        "expert_first": load.first_expert,
        "expert_tokens": load.tokens,
        "expert_steps": load.num_steps,
        "expert_layers": load.num_layers,
    }


def weights_info(loaded: LoadedRank | PeerReady | None) -> dict[str, Any]:
    """The fields of a rank's loaded weights, as ServingInfo, Heartbeat and PeerReady name them
    (none before it has loaded)."""
    if loaded is None:
        return {}
    return {
        "quantization": loaded.quantization,
        "weight_bytes_held": loaded.weight_bytes_held,
        "weight_bytes_read": loaded.weight_bytes_read,
    }


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
            spec_draft_tokens=info.spec_draft_tokens,
            spec_accepted_tokens=info.spec_accepted_tokens,
            spec_verified=info.spec_verified,
            quantization=info.quantization,
            weight_bytes_held=info.weight_bytes_held,
            weight_bytes_read=info.weight_bytes_read,
            expert_layout=info.expert_layout,
            expert_first=info.expert_first,
            expert_tokens=list(info.expert_tokens),
            expert_steps=info.expert_steps,
            expert_layers=info.expert_layers,
            **host_kv_info(info),
            interval_s=self.interval_s,
            sent_at=time.time(),
            detail=self.lifecycle.detail,
        )


class HeartbeatThread:
    """Publishes a rank's beats from a thread of its own, so the rank beats whatever its event
    loop is doing: a loop held up by a heavy frame must not make peers and monitors take a busy
    rank for a dead one. Besides every interval, it beats at once when asked (`beat_now`: the
    state changed) and when a subscriber joins (an XPUB socket sees each subscription), so a
    monitor that (re)connects learns the state without waiting an interval. `published` waits
    for a beat made after it was called: an admin reply that reports a state leaves only after a
    beat that says it. Binding happens at construction, so a second instance on the same
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
        # Verbose: every subscriber's subscription comes up, not only the first of a topic.
        self._sock = make_socket(
            zmq.Context.shadow(context.underlying),
            zmq.XPUB,
            bind=endpoint,
            options={zmq.XPUB_VERBOSE: 1, **(options or {})},
        )
        self._stopping = False
        # Written (from any thread) to wake the beat thread: a beat is asked for, or it stops.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()
        self._closed = False
        self._num_asked = 0  # beats asked for by beat_now and published
        # (ask number, future, its loop) of each `published` call not yet answered.
        self._waiters: list[tuple[int, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._last_sent = 0.0  # when the thread last beat (monotonic)
        self._thread = threading.Thread(target=self._run, name="aioworker-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Publish the final state once more, so monitors see it at once, and end the thread."""
        self._stopping = True
        self._wake()
        if self._thread.ident is not None:  # started: the thread closes, perhaps already has
            self._thread.join(timeout_s)
        else:  # never started: nobody else uses the socket
            self._close()

    def beat_now(self) -> None:
        """Publish a beat at once (from any thread): the state changed."""
        with self._lock:
            self._num_asked += 1
        self._wake()

    async def published(self) -> None:
        """Return once a beat made after this call has been published (at once if the thread
        does not run)."""
        if self._stopping or not self._thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._num_asked += 1
            self._waiters.append((self._num_asked, future, loop))
        self._wake()
        await future

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self._last_sent = time.monotonic()
        try:
            while not self._stopping:
                self._drain()  # before the beat: what asks after this point gets another
                with self._lock:
                    asked = self._num_asked
                self._send()
                self._report_if_late()
                self._answer_waiters(asked)
                poller.poll(self.source.interval_s * 1000)
            self._send()  # the final state
        finally:
            self._close()
            self._answer_waiters(None)

    def _report_if_late(self) -> None:
        now = time.monotonic()
        gap, self._last_sent = now - self._last_sent, now
        if gap > LATE_AFTER_INTERVALS * self.source.interval_s:
            log.warning(
                "heartbeat late: %.2fs since the last (interval %.2fs, state %s): the process "
                "was starved of CPU, or of the GIL by a call that holds it",
                gap,
                self.source.interval_s,
                self.source.lifecycle.state,
            )

    def _wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                os.write(self._wake_w, b"\0")

    def _drain(self) -> None:
        """Take the pending wake-ups and subscriptions: one beat answers them all."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with contextlib.suppress(zmq.Again):
            while True:
                self._sock.recv(zmq.NOBLOCK)

    def _answer_waiters(self, asked: int | None) -> None:
        """Wake the `published` calls that the beat just sent covers (None: all of them)."""
        with self._lock:
            done, waiting = [], []
            for waiter in self._waiters:
                (done if asked is None or waiter[0] <= asked else waiting).append(waiter)
            self._waiters = waiting
        for _, future, loop in done:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits
                loop.call_soon_threadsafe(_settle, future)

    def _send(self) -> None:
        try:
            self._sock.send_multipart(encode(self.source.make()), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeps up: a beat is worth nothing late

    def _close(self) -> None:
        """Once: `stop` may find the thread already ended by a stop it woke (is_alive raced the
        thread's own close, and closing the wake pipe twice raised EBADF at shutdown)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._sock.close(linger=500)  # let the last beat leave
        remove_ipc_file(self.endpoint)
        os.close(self._wake_r)
        os.close(self._wake_w)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
