"""Run one rank: pick the driver or peer program, give it systemd's notify socket (if any),
install signal handlers, run it under uvloop, and return the exit code for the supervisor."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

import uvloop

from aioworker.config import WorkerConfig
from aioworker.runtime.driver import Driver
from aioworker.runtime.notify import SystemdNotifier
from aioworker.runtime.peer import Peer

log = logging.getLogger(__name__)


def run_rank(
    config: WorkerConfig, group: int, rank: int, build: Callable[[], tuple[Any, Any]]
) -> int:
    program_class = Driver if rank == 0 else Peer
    program = program_class(config, group, rank, build, systemd_notifier())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_main(program))


def systemd_notifier() -> SystemdNotifier:
    notifier = SystemdNotifier()
    if notifier.is_enabled:
        interval = notifier.watchdog_interval_s
        watchdog = f"watchdog timeout {interval:g}s" if interval else "no watchdog"
        log.info("notifying systemd (%s)", watchdog)
    return notifier


async def _main(program) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_stop_signal, program, sig)
    return await program.run()


def _on_stop_signal(program, sig: signal.Signals) -> None:
    log.info("received %s", sig.name)
    if isinstance(program, Driver) and program.scheduler is not None and not program.state.is_final:
        program.start_drain(program.config.runtime.drain_timeout_s)
    elif not isinstance(program, Driver) and program.state.name == "READY":
        # A peer keeps serving: it stops when its driver publishes Shutdown after draining.
        return
    else:
        program.stop()
