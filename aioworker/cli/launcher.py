"""Supervise every rank of a deployment (and its API server) as child processes of one launcher:
forward stop signals, restart a data-parallel group whose rank crashed while the other groups
serve on (and a crashed API server), give up on a crash loop, stop the API server once every
rank has exited cleanly, and leave no orphans. Linux only; torch-free.

The launcher blocks SIGTERM, SIGINT and SIGCHLD and takes them one at a time with
`sigwaitinfo` / `sigtimedwait`, so it sleeps until something happens (or a timer is due: a kill
after the stop timeout, a restart after its backoff) and never polls.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aioworker.cli.restarts import RestartHistory, RestartPolicy

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_WATCHED_SIGNALS = STOP_SIGNALS | {signal.SIGCHLD}
_PR_SET_PDEATHSIG = 1
# A rank that exits with this code found its configuration invalid: restarting cannot help.
USAGE_EXIT_CODE = 2


@dataclass(frozen=True)
class ChildCommand:
    rank: int  # -1: not a rank (the API server)
    group: int
    argv: list[str]

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank >= 0 else "api server"

    @property
    def started_text(self) -> str:
        return f"{self.name} (group {self.group})" if self.rank >= 0 else self.name


@dataclass(eq=False)
class Unit:
    """What restarts together: one data-parallel group's ranks, or the API server."""

    name: str
    commands: list[ChildCommand]
    history: RestartHistory
    # The crash being handled: each of its children's exit code (the first to crash first).
    crash_codes: dict[str, int] = field(default_factory=dict)
    restart_at: float | None = None  # time.monotonic() of the restart, once it is down
    # Some rank exited cleanly (admin shutdown or drain): the group is done, never restarted.
    is_done: bool = False

    @property
    def is_api(self) -> bool:
        return self.commands[0].rank < 0


@dataclass(eq=False)
class Child:
    process: subprocess.Popen
    unit: Unit
    kill_at: float | None = None  # sent SIGTERM: SIGKILL at this time.monotonic()


class Launcher:
    def __init__(
        self,
        commands: list[ChildCommand],
        stop_timeout_s: float,
        policy: RestartPolicy | None = None,
    ) -> None:
        self.stop_timeout_s = stop_timeout_s
        self.policy = policy or RestartPolicy()
        self.units = _units(commands, self.policy)
        self.children: dict[str, Child] = {}  # name -> running child, until reaped
        self.exit_code = 0  # the first failure's, as a shell reports it
        self.num_stop_signals = 0
        self.is_stopping = False  # every child was told to stop: nothing restarts any more
        self._child_mask: set[signal.Signals] = set()

    def run(self) -> int:
        """Start every child, supervise them until all have exited and no restart is due, and
        return the exit code."""
        saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED_SIGNALS)
        self._child_mask = set(saved_mask)
        try:
            for unit in self.units:
                self.start_unit(unit)
            while self.children or self.pending_restarts():
                self.wait_for_event()
        finally:
            for child in self.children.values():
                child.process.kill()  # only reached on an unexpected error in the launcher itself
            signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        return self.exit_code

    def pending_restarts(self) -> list[Unit]:
        return [unit for unit in self.units if unit.restart_at is not None]

    def start_unit(self, unit: Unit) -> None:
        unit.restart_at, unit.crash_codes = None, {}
        if self.is_stopping:  # a child of an earlier unit could not start
            return
        setup = _child_setup(os.getpid(), self._child_mask)
        for command in unit.commands:
            try:
                # From this (the main) thread: PDEATHSIG fires when the spawning thread exits.
                process = subprocess.Popen(command.argv, stdin=subprocess.DEVNULL, preexec_fn=setup)
            except OSError as exc:
                report(f"could not start {command.name}: {exc}")
                self.fail(1)
                return
            self.children[command.name] = Child(process, unit)
            report(f"started {command.started_text} pid {process.pid}")

    # -- events -------------------------------------------------------------------------------

    def wait_for_event(self) -> None:
        timers = [c.kill_at for c in self.children.values() if c.kill_at is not None]
        timers += [unit.restart_at for unit in self.pending_restarts()]
        if not timers:
            info = signal.sigwaitinfo(_WATCHED_SIGNALS)
        else:
            info = signal.sigtimedwait(_WATCHED_SIGNALS, max(0.0, min(timers) - time.monotonic()))
        if info is None:
            self.on_timers()
        elif info.si_signo == signal.SIGCHLD:
            self.reap()
        else:
            self.on_stop_signal(signal.Signals(info.si_signo))

    def on_timers(self) -> None:
        now = time.monotonic()
        overdue = [
            n for n, c in self.children.items() if c.kill_at is not None and c.kill_at <= now
        ]
        if overdue:
            self.kill(overdue, f"still running {self.stop_timeout_s:g}s after SIGTERM")
        for unit in self.pending_restarts():
            if unit.restart_at <= now:
                self.start_unit(unit)

    def on_stop_signal(self, sig: signal.Signals) -> None:
        self.num_stop_signals += 1
        if self.num_stop_signals == 1:
            report(f"received {sig.name}: stopping {describe(list(self.children))}")
            self.stop_all()
        else:
            self.kill(list(self.children), f"received {sig.name} again")

    def reap(self) -> None:
        # One SIGCHLD may stand for several exits: look at every child.
        for name, child in list(self.children.items()):
            code = child.process.poll()
            if code is not None:
                del self.children[name]
                report(f"{name} (pid {child.process.pid}) {describe_exit(code)}")
                self.on_exit(name, child, code)

    def on_exit(self, name: str, child: Child, code: int) -> None:
        unit = child.unit
        is_clean = code == 0 or (child.kill_at is not None and -code in STOP_SIGNALS)
        if self.is_stopping or unit.is_done:
            if not is_clean and self.exit_code == 0:
                self.exit_code = shell_exit_code(code)
        elif unit.crash_codes:  # the rest of a crashed group, stopping
            unit.crash_codes[name] = code
            self.restart_when_down(unit)
        elif is_clean:
            unit.is_done = not unit.is_api  # ranks stopped by an operator stay stopped
        else:
            self.on_crash(name, unit, code)
        self.stop_api_once_ranks_are_done()

    def on_crash(self, name: str, unit: Unit, code: int) -> None:
        if code == USAGE_EXIT_CODE:
            report(f"{name} found its configuration invalid (exit {code}): not restarting it")
            self.fail(code)
            return
        unit.crash_codes[name] = code
        rest = self.live_children(unit)
        if rest:
            report(f"{unit.name} lost {name}: stopping {describe(rest)} of it before a restart")
            self.terminate(rest)
        self.restart_when_down(unit)

    def restart_when_down(self, unit: Unit) -> None:
        """Once every child of the crashed unit has exited: schedule its restart, or give up."""
        if self.live_children(unit):
            return
        now = time.monotonic()
        delay = unit.history.next_delay(now)
        codes = ", ".join(f"{n}: {shell_exit_code(c)}" for n, c in unit.crash_codes.items())
        if delay is None:
            self.give_up(unit, codes, unit.history.num_recent(now))
            return
        unit.history.record(now + delay)
        unit.restart_at = now + delay
        report(
            f"{unit.name} crashed (exit codes: {codes}); restarting it in {delay:g}s "
            f"({self.policy.describe()})"
        )

    def give_up(self, unit: Unit, codes: str, num_restarts: int) -> None:
        if self.policy.max_restarts == 0:
            report(
                f"{unit.name} crashed (exit codes: {codes}); launcher.max_restarts is 0: "
                "stopping everything"
            )
        else:
            report(
                f"{unit.name} is crash-looping: it crashed again after {num_restarts} restart(s) "
                f"within {self.policy.window_s:g}s (last exit codes: {codes}); stopping "
                "everything (launcher.max_restarts, launcher.restart_window_s)"
            )
        self.fail(shell_exit_code(next(iter(unit.crash_codes.values()))))

    def stop_api_once_ranks_are_done(self) -> None:
        """Every rank has exited cleanly (admin shutdown or drain of every group): the API server
        has nothing left to serve, so it stops too and the launcher returns."""
        ranks_done = all(unit.is_done for unit in self.units if not unit.is_api)
        ranks_left = any(not child.unit.is_api for child in self.children.values())
        api = any(child.unit.is_api for child in self.children.values())
        if ranks_done and not ranks_left and api and not self.is_stopping:
            report("every rank has exited: stopping the api server")
            self.stop_all()

    # -- stopping -----------------------------------------------------------------------------

    def live_children(self, unit: Unit) -> list[str]:
        return [name for name, child in self.children.items() if child.unit is unit]

    def fail(self, code: int) -> None:
        if self.exit_code == 0:
            self.exit_code = code
        self.stop_all()

    def stop_all(self) -> None:
        """SIGTERM every child (drivers drain and stop, then tell their peers); no restarts."""
        self.is_stopping = True
        for unit in self.units:
            unit.restart_at = None
        self.terminate(list(self.children))

    def terminate(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.stop_timeout_s
        for name in names:
            child = self.children[name]
            child.process.send_signal(signal.SIGTERM)
            if child.kill_at is None:
                child.kill_at = deadline

    def kill(self, names: list[str], reason: str) -> None:
        if names:
            report(f"{reason}: killing {describe(names)}")
        for name in names:
            self.children[name].process.kill()
            self.children[name].kill_at = None  # SIGKILL cannot be refused: no timer


def _units(commands: list[ChildCommand], policy: RestartPolicy) -> list[Unit]:
    by_group: dict[int, list[ChildCommand]] = {}
    for command in commands:
        by_group.setdefault(command.group, []).append(command)
    return [
        Unit("api server" if group < 0 else f"group {group}", members, RestartHistory(policy))
        for group, members in by_group.items()
    ]


def describe(names: list[str]) -> str:
    """`2 rank(s)`, `the api server`, `1 rank(s) and the api server`."""
    num_ranks = sum(1 for name in names if name.startswith("rank "))
    parts = [f"{num_ranks} rank(s)"] if num_ranks else []
    parts += ["the api server"] if len(names) > num_ranks else []
    return " and ".join(parts) or "nothing"


def report(message: str) -> None:
    print(f"aioworker serve: {message}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def shell_exit_code(code: int) -> int:
    """A child's exit status as a shell shows it: its code, or 128 + the signal that killed it."""
    return 128 - code if code < 0 else code


def _child_setup(parent_pid: int, mask: Iterable[signal.Signals]) -> Callable[[], None]:
    """What each child runs between fork and exec: die with the launcher, take signals again."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    mask = set(mask)

    def setup() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # nothing of Python's may run once unblocked
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent_pid:
                os._exit(1)  # the launcher died before the death signal was armed
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    return setup
