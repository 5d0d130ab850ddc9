"""Run one rank: the driver or a peer role on the shared rank, systemd's notify socket (if any),
signal handlers, uvloop; returns the exit code for the supervisor."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop

from aioworker.config import WorkerConfig
from aioworker.runtime.driver import Driver
from aioworker.runtime.notify import SystemdNotifier
from aioworker.runtime.peer import Peer
from aioworker.runtime.rank import BuildFn, Rank, RankRole
from aioworker.wire.security import ServerSecurity

log = logging.getLogger(__name__)


def run_rank(
    config: WorkerConfig,
    group: int,
    rank_in_group: int,
    build: BuildFn,
    security: ServerSecurity | None = None,
) -> int:
    rank = Rank(config, group, rank_in_group, systemd_notifier(), security)
    role = Driver(rank) if rank_in_group == 0 else Peer(rank)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(_main(rank, role, build))
    # The rank has stopped: a stop signal during the rest of the exit (torch's teardown takes a
    # while) must not turn its exit code into "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    return code


def systemd_notifier() -> SystemdNotifier:
    notifier = SystemdNotifier()
    if notifier.is_enabled:
        interval = notifier.watchdog_interval_s
        watchdog = f"watchdog timeout {interval:g}s" if interval else "no watchdog"
        log.info("notifying systemd (%s)", watchdog)
    return notifier


async def _main(rank: Rank, role: RankRole, build: BuildFn) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_stop_signal, role, sig)
    return await rank.run(role, build)


def _on_stop_signal(role: RankRole, sig: signal.Signals) -> None:
    log.info("received %s", sig.name)
    role.on_stop_signal()
