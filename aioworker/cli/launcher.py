"""Supervise every rank of a deployment (and its API server) as child processes of one launcher: forward stop signals,
tear the rest down when one fails, and leave no orphans. Linux only; torch-free.

The launcher blocks SIGTERM, SIGINT and SIGCHLD and takes them one at a time with
`sigwaitinfo` / `sigtimedwait`, so it sleeps until something happens and never polls.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_WATCHED_SIGNALS = STOP_SIGNALS | {signal.SIGCHLD}
_PR_SET_PDEATHSIG = 1


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


class Launcher:
    def __init__(self, commands: list[ChildCommand], stop_timeout_s: float) -> None:
        self.commands = commands
        self.stop_timeout_s = stop_timeout_s
        self.children: dict[str, subprocess.Popen] = {}  # name -> process, until reaped
        self.exit_code = 0  # the first failure's, as a shell reports it
        self.num_stop_signals = 0
        self.kill_at: float | None = None  # monotonic: when children sent SIGTERM get SIGKILL

    def run(self) -> int:
        """Start every child, supervise them until all have exited, and return the exit code."""
        saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED_SIGNALS)
        try:
            self.start(saved_mask)
            while self.children:
                self.wait_for_event()
        finally:
            for process in self.children.values():
                process.kill()  # only reached on an unexpected error in the launcher itself
            signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        return self.exit_code

    def start(self, child_mask: Iterable[signal.Signals]) -> None:
        setup = _child_setup(os.getpid(), set(child_mask))
        for command in self.commands:
            try:
                # From this (the main) thread: PDEATHSIG fires when the spawning thread exits.
                process = subprocess.Popen(command.argv, stdin=subprocess.DEVNULL, preexec_fn=setup)
            except OSError as exc:
                report(f"could not start {command.name}: {exc}")
                self.exit_code = 1
                self.terminate_all()
                return
            self.children[command.name] = process
            report(f"started {command.started_text} pid {process.pid}")

    def wait_for_event(self) -> None:
        if self.kill_at is None:
            info = signal.sigwaitinfo(_WATCHED_SIGNALS)
        else:
            info = signal.sigtimedwait(_WATCHED_SIGNALS, max(0.0, self.kill_at - time.monotonic()))
        if info is None:
            self.kill_all(f"still running {self.stop_timeout_s:g}s after SIGTERM")
        elif info.si_signo == signal.SIGCHLD:
            self.reap()
        else:
            self.on_stop_signal(signal.Signals(info.si_signo))

    def on_stop_signal(self, sig: signal.Signals) -> None:
        self.num_stop_signals += 1
        if self.num_stop_signals == 1:
            report(f"received {sig.name}: stopping {len(self.children)} rank(s)")
            self.terminate_all()
        else:
            self.kill_all(f"received {sig.name} again")

    def reap(self) -> None:
        # One SIGCHLD may stand for several exits: look at every child.
        for name, process in list(self.children.items()):
            code = process.poll()
            if code is None:
                continue
            del self.children[name]
            report(f"{name} (pid {process.pid}) {describe_exit(code)}")
            if not self.is_clean_exit(code) and self.exit_code == 0:
                self.exit_code = shell_exit_code(code)
                self.terminate_all()

    def is_clean_exit(self, code: int) -> bool:
        # A child killed by the stop signal it was sent (before it could handle it) did stop.
        return code == 0 or (self.num_stop_signals > 0 and -code in STOP_SIGNALS)

    def terminate_all(self) -> None:
        """SIGTERM every child: drivers drain and stop, then tell their peers to stop."""
        for process in self.children.values():
            process.send_signal(signal.SIGTERM)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.stop_timeout_s

    def kill_all(self, reason: str) -> None:
        if self.children:
            report(f"{reason}: killing {len(self.children)} rank(s)")
        for process in self.children.values():
            process.kill()
        self.kill_at = None  # SIGKILL cannot be refused: wait for the exits without a timer


def report(message: str) -> None:
    print(f"aioworker serve: {message}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def shell_exit_code(code: int) -> int:
    """A child's exit status as a shell shows it: its code, or 128 + the signal that killed it."""
    return 128 - code if code < 0 else code


def _child_setup(parent_pid: int, mask: set[signal.Signals]) -> Callable[[], None]:
    """What each child runs between fork and exec: die with the launcher, take signals again."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None

    def setup() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # nothing of Python's may run once unblocked
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent_pid:
                os._exit(1)  # the launcher died before the death signal was armed
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    return setup
