"""systemd notify: the exact datagrams on a fake NOTIFY_SOCKET, the lifecycle lines a rank sends,
and a real worker process that reports READY after loading, feeds the watchdog while it serves
and stops feeding it when a step hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.notify import SystemdNotifier
from aioworker.runtime.rank import Rank
from aioworker.runtime.state import ExitCode
from aioworker.wire.client import Client
from aioworker.wire.health import RankState
from tests.workers import admin, deployment, read_log, start_worker, stop

WATCHDOG_USEC = 400_000  # pings every 0.2 s


class Receiver:
    """Binds a datagram socket and records every line that arrives, with its arrival time."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.05)
        self.datagrams: list[bytes] = []
        self.lines: list[tuple[float, str]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        while not self._done.is_set():
            try:
                datagram = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.datagrams.append(datagram)
            now = time.monotonic()
            self.lines.extend((now, line) for line in datagram.decode().split("\n"))

    def texts(self) -> list[str]:
        return [line for _, line in list(self.lines)]

    def wait_for(self, line: str, timeout: float = 10.0) -> float:
        """The arrival time of the first `line`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, seen in list(self.lines):
                if seen == line:
                    return at
            time.sleep(0.02)
        raise AssertionError(f"{line!r} did not arrive within {timeout}s; got {self.texts()}")

    def pings_between(self, start: float, end: float) -> int:
        return sum(1 for at, line in list(self.lines) if line == "WATCHDOG=1" and start <= at < end)

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self.sock.close()


def wait_datagrams(receiver: Receiver, count: int) -> list[bytes]:
    deadline = time.monotonic() + 2.0
    while len(receiver.datagrams) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(receiver.datagrams)


@pytest.fixture
def path_receiver(tmp_path: Path):
    path = str(tmp_path / "notify.sock")
    receiver = Receiver(path)
    yield path, receiver
    receiver.close()


@pytest.fixture
def abstract_receiver():
    name = f"@aioworker-test-{uuid.uuid4().hex[:12]}"
    receiver = Receiver("\0" + name[1:])
    yield name, receiver
    receiver.close()


# -- the protocol --------------------------------------------------------------------------------


def test_every_message_arrives_as_exact_lines_on_a_path_socket(path_receiver) -> None:
    path, receiver = path_receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.is_enabled
    assert notifier.ready("READY: group 0 rank 0")
    notifier.status("FAILED: step 3 failed:\nRuntimeError: boom")
    notifier.extend_timeout(30)
    notifier.watchdog()
    notifier.stopping()
    assert wait_datagrams(receiver, 5) == [
        b"READY=1\nSTATUS=READY: group 0 rank 0",
        b"STATUS=FAILED: step 3 failed: RuntimeError: boom",
        b"EXTEND_TIMEOUT_USEC=30000000",
        b"WATCHDOG=1",
        b"STOPPING=1",
    ]


def test_an_abstract_socket_is_reached_through_its_at_sign_name(abstract_receiver) -> None:
    name, receiver = abstract_receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": name})
    assert notifier.address == "\0" + name[1:]
    assert notifier.status("LOADING model: group 0 rank 0")
    assert wait_datagrams(receiver, 1) == [b"STATUS=LOADING model: group 0 rank 0"]


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "relative"}])
def test_without_a_notify_socket_nothing_is_sent_and_nothing_raises(environ) -> None:
    notifier = SystemdNotifier(environ)
    assert not notifier.is_enabled
    sent = [notifier.ready("x"), notifier.status("x"), notifier.extend_timeout(1)]
    sent += [notifier.watchdog(), notifier.stopping()]
    assert sent == [False] * 5


def test_a_send_that_fails_returns_false_instead_of_raising(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert notifier.is_enabled
    assert not notifier.watchdog()


@pytest.mark.parametrize(
    ("environ", "interval_s"),
    [
        ({"WATCHDOG_USEC": "400000"}, 0.4),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval_is_honoured_only_for_this_process(environ, interval_s) -> None:
    assert SystemdNotifier(environ).watchdog_interval_s == interval_s


# -- what a rank sends ---------------------------------------------------------------------------


@pytest.fixture
def rank_and_receiver(path_receiver):
    path, receiver = path_receiver
    config, _ = deployment(**{"runtime.hung_step_timeout_s": 0.5})
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    rank = Rank(config, 0, 0, notifier)
    yield rank, receiver
    rank.context.term()


def test_a_rank_tells_every_state_and_ready_and_stopping_once(rank_and_receiver) -> None:
    rank, receiver = rank_and_receiver
    for state in (RankState.LOADING, RankState.READY, RankState.PAUSED, RankState.READY):
        rank.lifecycle.move(state)
    rank.lifecycle.move(RankState.DRAINING)
    rank.lifecycle.fail(ExitCode.FAILED, "step 7 failed:\nboom")
    assert wait_datagrams(receiver, 7) == [
        b"STATUS=STARTING: group 0 rank 0",
        b"STATUS=LOADING model: group 0 rank 0",
        b"READY=1\nSTATUS=READY: group 0 rank 0",
        b"STATUS=PAUSED: group 0 rank 0",
        b"STATUS=READY: group 0 rank 0",
        b"STOPPING=1\nSTATUS=DRAINING requests in flight: group 0 rank 0",
        b"STATUS=FAILED: step 7 failed: boom",
    ]


def test_a_step_stuck_past_the_hung_timeout_is_not_progress(rank_and_receiver) -> None:
    rank, _ = rank_and_receiver
    rank.lifecycle.move(RankState.LOADING)
    rank.lifecycle.move(RankState.READY)
    progress = rank.progress
    assert rank.is_progressing()  # idle: the loop being alive is enough
    progress.step_id, progress.started_at = 3, time.monotonic() - 10.0
    assert rank.is_progressing()  # a new step since the last check
    assert not rank.is_progressing()  # the same step, 10 s old, past 0.5 s
    progress.step_id = 4
    assert rank.is_progressing()
    progress.started_at = time.monotonic()
    assert rank.is_progressing()  # the same step, but young
    rank.lifecycle.stop()
    assert not rank.is_progressing()


# -- a real worker process -----------------------------------------------------------------------


@pytest.fixture
def notify_env(path_receiver, monkeypatch):
    """Worker processes started by the test inherit NOTIFY_SOCKET and WATCHDOG_USEC."""
    path, receiver = path_receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    return receiver


@pytest.fixture
def spawned():
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize("how", ["drain", "sigterm"])
def test_a_worker_is_ready_after_loading_feeds_the_watchdog_and_stops(
    notify_env, spawned, how
) -> None:
    receiver = notify_env
    config, set_args = deployment()
    process = start_worker(0, set_args, "--fake-executor")
    spawned.append(process)
    ready_at = receiver.wait_for("READY=1", timeout=20.0)
    texts = receiver.texts()
    assert texts[0] == "STATUS=STARTING: group 0 rank 0"
    assert "EXTEND_TIMEOUT_USEC=30000000" in texts
    assert texts.index("STATUS=LOADING model: group 0 rank 0") < texts.index("READY=1")

    time.sleep(1.5)
    assert receiver.pings_between(ready_at, ready_at + 1.5) >= 4
    if how == "drain":
        assert admin(config, "drain").ok
    else:
        process.send_signal(signal.SIGTERM)
    receiver.wait_for("STOPPING=1")
    assert process.wait(10) == 0, read_log(process)
    receiver.wait_for("STATUS=STOPPED: group 0 rank 0")
    assert receiver.texts().count("READY=1") == 1
    assert receiver.texts()[-1] == "STATUS=STOPPED: group 0 rank 0"


def test_a_worker_whose_step_hangs_stops_feeding_the_watchdog(notify_env, spawned) -> None:
    receiver = notify_env
    config, set_args = deployment(**{"runtime.hung_step_timeout_s": 0.5})
    spawned.append(start_worker(0, set_args, "--fake-executor", "--fake-step-ms", "5000"))
    ready_at = receiver.wait_for("READY=1", timeout=20.0)
    time.sleep(0.5)

    async def submit_and_wait() -> float:
        async with Client.from_config(config) as client:
            await client.submit([1, 2, 3], SamplingParams(max_tokens=4))
            submitted_at = time.monotonic()
            await asyncio.sleep(2.5)  # keep the client (and its queued request) alive
            return submitted_at

    submitted_at = asyncio.run(submit_and_wait())
    assert receiver.pings_between(ready_at, submitted_at) >= 2
    assert receiver.pings_between(submitted_at + 1.0, submitted_at + 2.5) == 0
    stop(spawned, timeout=5.0)
