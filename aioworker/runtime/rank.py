"""What every rank's asyncio program shares, driver or peer: start-up (heartbeats first, then the
role's sockets, then the load off the loop), serving until stopped, and shutdown. The role adds
its own sockets and concerns through the `RankRole` interface."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import zmq
import zmq.asyncio

from aioworker.config import ConfigError, WorkerConfig
from aioworker.core.executor import Executor
from aioworker.core.loaded_rank import LoadedRank
from aioworker.runtime.concerns import Concerns
from aioworker.runtime.heartbeat import HeartbeatSource, HeartbeatThread, ServingInfo
from aioworker.runtime.lifecycle import FatalError, RankLifecycle
from aioworker.runtime.notify import SystemdNotifier, extend_start_timeout, feed_watchdog
from aioworker.runtime.progress import StepProgress
from aioworker.runtime.state import ExitCode
from aioworker.wire.health import RankState
from aioworker.wire.security import Role, ServerSecurity, stop_authenticator
from aioworker.wire.transport import (
    EndpointInUseError,
    group_endpoints,
    make_socket,
    remove_ipc_file,
)

log = logging.getLogger(__name__)

# Builds the rank's compute (model, cache, executor thread) on a daemon thread; the argument
# reports start-up phases (PROFILING, WARMING) as they begin.
BuildFn = Callable[[Callable[[str], None]], tuple[Executor, LoadedRank]]


class RankRole(Protocol):
    """What the driver and a peer add to the shared rank."""

    def bind(self) -> None:
        """Create the role's sockets and start-up concerns, before the (long) load."""

    async def serve(self, executor: Executor, loaded: LoadedRank) -> None:
        """Start serving once loaded."""

    async def close(self) -> None:
        """Last words before the sockets close (terminal outputs, Shutdown to peers)."""

    def serving_info(self) -> ServingInfo: ...

    def on_stop_signal(self) -> None:
        """SIGTERM or SIGINT arrived."""


class Rank:
    def __init__(
        self,
        config: WorkerConfig,
        group: int,
        index: int,
        notifier: SystemdNotifier | None = None,
        security: ServerSecurity | None = None,
    ) -> None:
        """`security`: from ServerSecurity.from_config (checked by the caller: it raises on a
        bad key file); None reads it here."""
        self.config = config
        self.group = group
        self.index = index  # this rank's number in its group (0: the driver)
        self.endpoints = group_endpoints(
            config.runtime, group, config.parallel.tensor_parallel_size
        )
        self.context = zmq.asyncio.Context()
        self.notifier = notifier if notifier is not None else SystemdNotifier({})
        self.security = security if security is not None else ServerSecurity.from_config(config)
        self.lifecycle = RankLifecycle(group, index, self.notifier)
        self.progress = StepProgress(config.runtime.hung_step_timeout_s)
        self.concerns = Concerns(self.lifecycle)
        self.executor: Executor | None = None
        self._sockets: list[zmq.asyncio.Socket] = []
        self._bound: list[str] = []  # endpoints this rank bound: ipc files to remove at exit
        self._beats: HeartbeatThread | None = None
        self._authenticator = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self, role: RankRole, build: BuildFn) -> int:
        """Start, serve until stopped, shut down; returns the exit code."""
        try:
            await self._start_unless_stopped(role, build)
            await self.lifecycle.stopped.wait()
        except FatalError as exc:
            self.lifecycle.fail(exc.code, str(exc))
        except EndpointInUseError as exc:  # a second instance: one line, no traceback
            self.lifecycle.fail(ExitCode.FAILED, str(exc))
        except ConfigError as exc:
            self.lifecycle.fail(ExitCode.USAGE, str(exc))
        except Exception as exc:
            log.exception("rank %d of group %d failed", self.index, self.group)
            self.lifecycle.fail(ExitCode.FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            await self._shutdown(role)
        return int(self.lifecycle.exit_code)

    async def _start_unless_stopped(self, role: RankRole, build: BuildFn) -> None:
        """A stop (signal, admin) during a long load or peer wait ends start-up at once."""
        startup = asyncio.ensure_future(self._startup(role, build))
        stop = asyncio.ensure_future(self.lifecycle.stopped.wait())
        await asyncio.wait({startup, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not startup.done():
            startup.cancel()
            await asyncio.gather(startup, return_exceptions=True)
            return
        startup.result()

    async def _startup(self, role: RankRole, build: BuildFn) -> None:
        # Before any CURVE socket binds: without a ZAP handler libzmq admits any key.
        self._authenticator = self.security.start_authenticator(self.context)
        interval = self.config.runtime.heartbeat_interval_s
        source = HeartbeatSource(
            self.group, self.index, interval, self.lifecycle, self.progress, role.serving_info
        )
        endpoint = self.endpoints.heartbeats[self.index]
        options = self.security.server_options(endpoint, Role.BEATS)
        self._beats = HeartbeatThread(source, self.context, endpoint, options)
        self.lifecycle.listeners.append(self._beats.beat_now)
        self._beats.start()
        if self.notifier.is_enabled:
            self.spawn(extend_start_timeout(self.notifier, self.lifecycle.is_starting))
        role.bind()
        self.lifecycle.move(RankState.LOADING)
        loop = asyncio.get_running_loop()

        def report_phase(state: str) -> None:
            """Called by the build thread (PROFILING, WARMING): the state belongs to the loop."""
            loop.call_soon_threadsafe(self.lifecycle.enter_start_phase, RankState(state))

        self.executor, loaded = await run_in_daemon_thread(lambda: build(report_phase))
        await role.serve(self.executor, loaded)
        interval = self.notifier.watchdog_interval_s
        if self.notifier.is_enabled and interval:
            self.spawn(feed_watchdog(self.notifier, interval / 2, self.is_progressing))

    async def _shutdown(self, role: RankRole) -> None:
        if not self.lifecycle.state.is_final:
            self.lifecycle.move(RankState.STOPPED)
        await role.close()
        if self._beats is not None:
            self._beats.stop()
        await self.concerns.cancel_all()
        if self.executor is not None and not self.executor.shutdown(timeout=5.0):
            log.warning(
                "the executor thread did not stop within 5s (stuck in a step); exiting anyway"
            )
        for sock in self._sockets:
            sock.close(linger=0)
        stop_authenticator(self._authenticator)  # before the context terminates
        self.context.term()
        for endpoint in self._bound:
            remove_ipc_file(endpoint)

    async def beat_published(self) -> None:
        """Return once a heartbeat made after this call has left (at once without heartbeats,
        or once stopped: the heartbeat thread's last beat says so as it ends)."""
        if self._beats is not None and not self.lifecycle.state.is_final:
            await self._beats.published()

    def is_progressing(self) -> bool:
        """What the systemd watchdog asks: not stopped, and no step hung."""
        return not self.lifecycle.state.is_final and self.progress.is_progressing()

    # -- helpers ------------------------------------------------------------------------------

    def socket(self, kind: int, **kwargs) -> zmq.asyncio.Socket:
        """A socket closed with the rank (see transport.make_socket for the arguments), taking
        messages up to runtime.max_message_bytes unless told otherwise."""
        kwargs.setdefault("max_message_bytes", self.config.runtime.max_message_bytes)
        sock = make_socket(self.context, kind, **kwargs)
        self._sockets.append(sock)
        if kwargs.get("bind"):
            self._bound.append(kwargs["bind"])
        return sock

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """Run a concern as its own task; if it crashes, the rank fails with its exception."""
        return self.concerns.spawn(coro)


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
