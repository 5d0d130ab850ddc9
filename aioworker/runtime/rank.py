"""What every rank's asyncio program shares: state (told to systemd as it changes), heartbeats,
loading off the loop, tasks that fail the rank when they crash, and the startup / serve /
shutdown skeleton."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
import zmq.asyncio

from aioworker.config import WorkerConfig
from aioworker.runtime.heartbeat import publish_heartbeats
from aioworker.runtime.notify import SystemdNotifier, extend_start_timeout, feed_watchdog
from aioworker.runtime.state import ExitCode, RankState
from aioworker.wire.protocol import Heartbeat, encode
from aioworker.wire.transport import group_endpoints, make_socket

log = logging.getLogger(__name__)

# Builds the rank's compute (model, cache, executor thread); runs in a worker thread.
BuildFn = Callable[[], tuple[Any, Any]]

STARTING_STATES = frozenset(
    {RankState.STARTING, RankState.LOADING, RankState.PROFILING, RankState.WARMING}
)
STOPPING_STATES = frozenset({RankState.DRAINING, RankState.STOPPED, RankState.FAILED})
# What systemd shows after the state's name (`systemctl status`); the rest show the name alone.
STATUS_PHRASES = {
    RankState.LOADING: "LOADING model",
    RankState.PROFILING: "PROFILING memory",
    RankState.WARMING: "WARMING up",
    RankState.DRAINING: "DRAINING requests in flight",
}


class FatalError(RuntimeError):
    def __init__(self, code: ExitCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class RankProgram:
    def __init__(
        self,
        config: WorkerConfig,
        group: int,
        rank: int,
        build: BuildFn,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        self.config = config
        self.group = group
        self.rank = rank
        self.build = build
        self.endpoints = group_endpoints(
            config.runtime, group, config.parallel.tensor_parallel_size
        )
        self.context = zmq.asyncio.Context()
        self.notifier = notifier if notifier is not None else SystemdNotifier({})
        self._told_ready = self._told_stopping = False
        self._watched_step_id = -1
        self.detail = ""
        self.state = RankState.STARTING
        self.exit_code = ExitCode.OK
        self.executor: Any = None
        self.loaded: Any = None
        self.step_id = -1
        self.step_started_at: float | None = None
        self.weights_version = 0
        self.num_tokens_generated = 0
        self._beat_tokens = 0
        self._beat_time = time.monotonic()
        self._tasks: set[asyncio.Task] = set()
        self._sockets: list[zmq.asyncio.Socket] = []
        self.stopped: asyncio.Event | None = None
        self._beat_socket: zmq.asyncio.Socket | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        self.stopped = asyncio.Event()
        try:
            await self._start_unless_stopped()
            await self.stopped.wait()
        except FatalError as exc:
            self.fail(exc.code, str(exc))
        except Exception as exc:
            log.exception("rank %d of group %d failed", self.rank, self.group)
            self.fail(ExitCode.FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            await self.shutdown()
        return int(self.exit_code)

    def _enter_phase(self, state: RankState) -> None:
        if not self.state.is_final:
            self.state = state

    async def _start_unless_stopped(self) -> None:
        """A stop (signal, admin) during a long load or peer wait ends start-up at once."""
        startup = asyncio.ensure_future(self.startup())
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait({startup, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not startup.done():
            startup.cancel()
            await asyncio.gather(startup, return_exceptions=True)
            return
        startup.result()

    async def startup(self) -> None:
        self._beat_socket = self.socket(zmq.PUB, bind=self.endpoints.heartbeats[self.rank])
        interval = self.config.runtime.heartbeat_interval_s
        self.spawn(publish_heartbeats(self._beat_socket, self.heartbeat, interval))
        if self.notifier.is_enabled:
            self.spawn(extend_start_timeout(self.notifier, self.is_starting))
        self.bind_sockets()
        self.state = RankState.LOADING
        loop = asyncio.get_running_loop()

        def report_phase(state: str) -> None:
            """Called by the build thread (PROFILING, WARMING): the state belongs to the loop."""
            loop.call_soon_threadsafe(self._enter_phase, RankState(state))

        self.executor, self.loaded = await run_in_daemon_thread(lambda: self.build(report_phase))
        await self.serve()
        self.feed_systemd_watchdog()

    def bind_sockets(self) -> None:
        """Subclasses create their sockets here, before the (long) load."""

    async def serve(self) -> None:
        """Subclasses start their tasks here once loaded."""

    async def shutdown(self) -> None:
        if not self.state.is_final:
            self.state = RankState.STOPPED
        await self.flush_last_beat()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.executor is not None and not self.executor.shutdown(timeout=5.0):
            log.warning(
                "the executor thread did not stop within 5s (stuck in a step); exiting anyway"
            )
        for sock in self._sockets:
            sock.close(linger=0)
        self.context.term()

    async def flush_last_beat(self) -> None:
        """Publish the final state (STOPPED / FAILED) once more so monitors see it at once."""
        if self._beat_socket is None:
            return
        try:
            await self._beat_socket.send_multipart(encode(self.heartbeat()), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        self._sockets.remove(self._beat_socket)
        self._beat_socket.close(linger=500)  # let the last beat leave

    def stop(self) -> None:
        if not self.state.is_final:
            self.state = RankState.STOPPED
        if self.stopped is not None:
            self.stopped.set()

    def fail(self, code: ExitCode, reason: str) -> None:
        if self.state is not RankState.FAILED:
            log.error(
                "rank %d of group %d failing (exit %d): %s", self.rank, self.group, code, reason
            )
            self.detail = reason
            self.exit_code = code
            self.state = RankState.FAILED
        if self.stopped is not None:
            self.stopped.set()

    # -- state, as systemd sees it ------------------------------------------------------------

    @property
    def state(self) -> RankState:
        return self._state

    @state.setter
    def state(self, state: RankState) -> None:
        self._state = state
        self.notify_systemd()

    def notify_systemd(self) -> None:
        """STATUS on every change; READY=1 the first time the rank serves; STOPPING=1 once."""
        status = self.status_text()
        if self._state is RankState.READY and not self._told_ready:
            self._told_ready = True
            self.notifier.ready(status)
        elif self._state in STOPPING_STATES and not self._told_stopping:
            self._told_stopping = True
            self.notifier.stopping(status)
        else:
            self.notifier.status(status)

    def status_text(self) -> str:
        if self._state is RankState.FAILED:
            return f"FAILED: {self.detail}"
        phrase = STATUS_PHRASES.get(self._state, str(self._state))
        return f"{phrase}: group {self.group} rank {self.rank}"

    def is_starting(self) -> bool:
        return self._state in STARTING_STATES

    def feed_systemd_watchdog(self) -> None:
        """Once serving: WATCHDOG=1 at half systemd's interval while `is_progressing()`."""
        interval = self.notifier.watchdog_interval_s
        if self.notifier.is_enabled and interval:
            self.spawn(feed_watchdog(self.notifier, interval / 2, self.is_progressing))

    def is_progressing(self) -> bool:
        """Not stopped, and no step in flight past runtime.hung_step_timeout_s unless a newer step
        started since the previous call (each call remembers the step id it saw)."""
        if self._state.is_final:
            return False
        step_id, started = self.step_id, self.step_started_at
        moved, self._watched_step_id = step_id != self._watched_step_id, step_id
        timeout = self.config.runtime.hung_step_timeout_s
        return started is None or moved or timeout <= 0 or time.monotonic() - started < timeout

    # -- helpers ------------------------------------------------------------------------------

    def socket(self, kind: int, **kwargs) -> zmq.asyncio.Socket:
        sock = make_socket(self.context, kind, **kwargs)
        self._sockets.append(sock)
        return sock

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """Run a concern as its own task; if it crashes, the rank fails with its exception."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, FatalError):
            self.fail(exc.code, str(exc))
        elif exc is not None:
            log.error("task %s crashed", task.get_coro(), exc_info=exc)
            self.fail(ExitCode.FAILED, f"{type(exc).__name__}: {exc}")

    # -- heartbeat ----------------------------------------------------------------------------

    def queue_depths(self) -> tuple[int, int, int, int]:
        """(running, waiting, kv blocks used, kv blocks total); the driver knows them."""
        total = self.loaded.num_blocks if self.loaded is not None else 0
        return 0, 0, 0, total

    def heartbeat(self) -> Heartbeat:
        now = time.monotonic()
        elapsed = now - self._beat_time
        rate = (self.num_tokens_generated - self._beat_tokens) / elapsed if elapsed > 0 else 0.0
        self._beat_time, self._beat_tokens = now, self.num_tokens_generated
        running, waiting, used, total = self.queue_depths()
        started = self.step_started_at
        return Heartbeat(
            group=self.group,
            rank=self.rank,
            pid=os.getpid(),
            state=str(self.state),
            step_id=self.step_id,
            step_elapsed_s=now - started if started is not None else 0.0,
            num_running=running,
            num_waiting=waiting,
            kv_blocks_used=used,
            kv_blocks_total=total,
            tokens_per_s=rate,
            weights_version=self.weights_version,
            interval_s=self.config.runtime.heartbeat_interval_s,
            sent_at=time.time(),
            detail=self.detail,
        )


async def run_in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Await `fn()` run in a daemon thread. Unlike asyncio.to_thread, whose pool threads are joined
    at exit, a load stuck in a rendezvous cannot keep a failed rank's process alive."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            value, error = fn(), None
        except BaseException as exc:
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop is gone: the rank already stopped

    threading.Thread(target=target, name="aioworker-load", daemon=True).start()
    return await future
