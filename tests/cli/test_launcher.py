"""`aioworker serve` supervising fake-executor ranks: clean stop, teardown on a failure, no orphans;
and every shipped config loads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import zmq

from aioworker.config import load_config
from aioworker.wire.protocol import HEARTBEAT_DECODER
from aioworker.wire.transport import all_group_endpoints
from tests.api.service import api_url, request, wait_healthy
from tests.processes import Process
from tests.workers import admin

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
STARTED = re.compile(r"started rank (\d+) \(group (\d+)\) pid (\d+)")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="aioworker serve is Linux-only")


def new_name() -> str:
    return f"test-serve-{uuid.uuid4().hex[:8]}"


class Serve(Process):
    """`aioworker serve --fake-executor` in a unique deployment, its stderr collected by a thread."""

    def __init__(self, *args: str, name: str | None = None) -> None:
        self.name = name or new_name()
        self.overrides = {"runtime.name": self.name, "runtime.heartbeat_interval_s": 0.2}
        sets = [f"--set={key}={value!r}" for key, value in self.overrides.items()]
        super().__init__(["serve", "--fake-executor", *sets, *args])

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """The first stderr line that matches `pattern`, once it is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            assert self.process.poll() is None, f"exited:\n{self.stderr}"
            time.sleep(0.02)
        raise AssertionError(f"no line matches {pattern!r} within {timeout}s:\n{self.stderr}")

    def child_pids(self, count: int, timeout: float = 10.0) -> dict[int, int]:
        """rank -> pid, from the launcher's `started` lines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = {int(m[1]): int(m[3]) for line in self.lines if (m := STARTED.search(line))}
            if len(pids) == count:
                return pids
            time.sleep(0.02)
        raise AssertionError(f"the launcher did not start {count} ranks:\n{self.stderr}")

    def wait_ready(self, tp: int, dp: int, timeout: float = 10.0) -> None:
        """Until every rank's heartbeat says READY."""
        config = load_config(overrides=self.overrides)
        context = zmq.Context()
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        for group in all_group_endpoints(config.runtime, tp, dp):
            for endpoint in group.heartbeats:
                sock.connect(endpoint)
        ready: set[tuple[int, int]] = set()
        deadline = time.monotonic() + timeout
        try:
            while len(ready) < tp * dp and time.monotonic() < deadline:
                if sock.poll(100):
                    beat = HEARTBEAT_DECODER.decode(sock.recv_multipart())
                    if beat.state == "READY":
                        ready.add((beat.group, beat.rank))
        finally:
            sock.close()
            context.term()
        assert len(ready) == tp * dp, f"ready: {sorted(ready)}\n{self.stderr}"


# Restarts in 0.2 s, then 0.4 s: quick, and still the doubling the launcher does.
FAST_RESTARTS = ("--set=launcher.restart_backoff_s=0.2", "--set=launcher.max_restart_backoff_s=1")


class HttpLoad:
    """Threads that send completions one after another until the block ends; every answer is
    kept as (status, error message or "")."""

    def __init__(self, url: str, num_threads: int) -> None:
        self.url = url
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send) for _ in range(num_threads)]

    def __enter__(self) -> HttpLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _send(self) -> None:
        body = {"model": "embedded", "prompt": "Hello", "max_tokens": 4}
        while not self._stop.is_set():
            status, _, raw = request(self.url, "POST", "/v1/completions", body)
            message = "" if status == 200 else json.loads(raw)["error"]["message"]
            self.answers.append((status, message))

    def wait_for(self, count: int, timeout: float = 60.0) -> list[tuple[int, str]]:
        """Until `count` answers have come back; all of them so far."""
        wait_until(lambda: len(self.answers) >= count, timeout)
        return list(self.answers)


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout}s"
        time.sleep(0.05)


def health_states(url: str) -> list[str]:
    return [group["state"] for group in json.loads(request(url, "GET", "/health")[2])["groups"]]


def tokens_generated(config, group: int) -> int:
    reply = admin(config, "status", group=group, timeout=1.0)
    return reply.data.get("num_tokens_generated", 0) if reply is not None else 0


@pytest.fixture
def serve():
    launched: list[Serve] = []

    def start(*args: str, name: str | None = None) -> Serve:
        launched.append(Serve(*args, name=name))
        return launched[-1]

    yield start
    for launcher in launched:
        launcher.close()


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if is_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@linux_only
@pytest.mark.parametrize("tp, dp", [(1, 2), (2, 1)])
def test_sigterm_stops_every_rank_cleanly(serve, tp: int, dp: int) -> None:
    launcher = serve(f"--tp={tp}", f"--dp={dp}")
    pids = launcher.child_pids(tp * dp)
    assert sorted(pids) == list(range(tp * dp))
    launcher.wait_ready(tp, dp)

    launcher.process.send_signal(signal.SIGTERM)

    assert launcher.wait(timeout=10) == 0, launcher.stderr
    assert not wait_gone(list(pids.values()), timeout=1)
    for rank, pid in pids.items():
        assert f"rank {rank} (pid {pid}) exited with code 0" in launcher.stderr


@linux_only
def test_a_killed_rank_restarts_its_group_while_the_other_serves(serve) -> None:
    launcher = serve("--tp=1", "--dp=2", "--api-port=0", *FAST_RESTARTS)
    pids = launcher.child_pids(2)
    url = api_url(launcher)
    wait_healthy(url, launcher, timeout=60)
    config = load_config(overrides=launcher.overrides)
    with HttpLoad(url, num_threads=4) as load:
        load.wait_for(50)
        os.kill(pids[1], signal.SIGKILL)
        restarted = launcher.wait_for(rf"started rank 1 \(group 1\) pid (?!{pids[1]}\b)(\d+)")
        # Group 1 serves again: the gateway sees it READY and sends it requests.
        wait_until(lambda: health_states(url) == ["READY", "READY"], timeout=30)
        generated = tokens_generated(config, group=1)
        wait_until(lambda: tokens_generated(config, group=1) > generated, timeout=30)
        served = load.wait_for(len(load.answers) + 50)
    statuses = [status for status, _ in served]
    errors = [message for status, message in served if status != 200]
    # None was lost, and only requests in flight on the dead group failed, each saying so: at
    # most one per thread (each waits for its answer before it sends again).
    assert set(statuses) <= {200, 503} and len(errors) <= 4, errors
    assert all("group 1" in message for message in errors), errors
    assert "group 1 crashed (exit codes: rank 1: 137); restarting it in 0.2s" in launcher.stderr
    assert f"rank 0 (pid {pids[0]})" not in launcher.stderr  # group 0 never stopped
    assert launcher.process.poll() is None and int(restarted[1]) != pids[1]

    # The API server is restarted the same way.
    api_pid = int(launcher.wait_for(r"started api server pid (\d+)")[1])
    os.kill(api_pid, signal.SIGKILL)
    launcher.wait_for(r"api server crashed \(exit codes: api server: 137\); restarting it")
    new_url = launcher.wait_for(
        rf"aioworker api: serving .* on (http://[\d.]+:(?!{urlparse(url).port}\b)\d+)"
    )[1]
    wait_healthy(new_url, launcher, timeout=60)


@linux_only
def test_a_killed_peer_restarts_its_whole_tensor_parallel_group(serve) -> None:
    launcher = serve("--tp=2", "--dp=1", *FAST_RESTARTS)
    pids = launcher.child_pids(2)
    launcher.wait_ready(2, 1)

    os.kill(pids[1], signal.SIGKILL)

    # Its driver is stopped first, then both start again.
    launcher.wait_for(rf"rank 0 \(pid {pids[0]}\) exited with code")
    launcher.wait_for(rf"started rank 0 \(group 0\) pid (?!{pids[0]}\b)\d+")
    launcher.wait_for(rf"started rank 1 \(group 0\) pid (?!{pids[1]}\b)\d+")
    launcher.wait_ready(2, 1)
    assert "group 0 lost rank 1: stopping 1 rank(s) of it before a restart" in launcher.stderr
    assert launcher.process.poll() is None


@linux_only
def test_without_restarts_a_crash_stops_the_deployment(serve) -> None:
    launcher = serve("--tp=1", "--dp=2", "--set=launcher.max_restarts=0")
    pids = launcher.child_pids(2)
    launcher.wait_ready(1, 2)

    os.kill(pids[1], signal.SIGKILL)

    assert launcher.wait(timeout=10) == 128 + signal.SIGKILL, launcher.stderr
    assert (
        "group 1 crashed (exit codes: rank 1: 137); launcher.max_restarts is 0: stopping everything"
    ) in launcher.stderr
    # The survivor was sent SIGTERM and drained.
    assert f"rank 0 (pid {pids[0]}) exited with code 0" in launcher.stderr


@linux_only
def test_a_group_that_always_crashes_ends_the_launcher(serve) -> None:
    """Group 1's task endpoint is taken, so its driver exits 1 at every start: after two
    restarts the launcher gives up, names the group and its exit codes, and stops group 0."""
    name = new_name()
    config = load_config(overrides={"runtime.name": name})
    tasks = all_group_endpoints(config.runtime, 1, 2)[1].tasks
    context = zmq.Context()
    squatter = context.socket(zmq.PULL)
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.bind(tasks)
    try:
        launcher = serve(
            "--tp=1", "--dp=2", "--set=launcher.max_restarts=2", *FAST_RESTARTS, name=name
        )
        assert launcher.wait(timeout=60) == 1, launcher.stderr
    finally:
        squatter.close()
        context.term()
    stderr = launcher.stderr
    assert "restarting it in 0.2s" in stderr and "restarting it in 0.4s" in stderr, stderr
    assert (
        "group 1 is crash-looping: it crashed again after 2 restart(s) within 300s "
        "(last exit codes: rank 1: 1); stopping everything"
    ) in stderr
    assert re.search(r"rank 0 \(pid \d+\) exited with code 0", stderr), stderr


@linux_only
def test_once_every_rank_is_shut_down_or_drained_serve_exits(serve) -> None:
    launcher = serve("--tp=1", "--dp=2", "--api-port=0")
    url = api_url(launcher)
    wait_healthy(url, launcher, timeout=60)
    config = load_config(overrides=launcher.overrides)

    assert admin(config, "drain", group=0).ok
    assert admin(config, "shutdown", group=1).ok

    assert launcher.wait(timeout=30) == 0, launcher.stderr
    assert "every rank has exited: stopping the api server" in launcher.stderr
    assert re.search(r"api server \(pid \d+\) exited with code 0", launcher.stderr)
    assert "restarting" not in launcher.stderr


@linux_only
@pytest.mark.parametrize("force", ["stop timeout", "second signal"])
def test_ranks_that_do_not_stop_are_killed(serve, force: str) -> None:
    launcher = serve("--tp=1", "--dp=2", f"--stop-timeout={1 if force == 'stop timeout' else 60}")
    pids = launcher.child_pids(2)
    launcher.wait_ready(1, 2)
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)  # frozen: SIGTERM cannot stop them

    launcher.process.send_signal(signal.SIGTERM)
    if force == "second signal":
        time.sleep(0.2)
        launcher.process.send_signal(signal.SIGINT)

    assert launcher.wait(timeout=5) == 128 + signal.SIGKILL, launcher.stderr
    reason = (
        "still running 1s after SIGTERM" if force == "stop timeout" else "received SIGINT again"
    )
    assert launcher.stderr.count(f"{reason}: killing 2 rank(s)") == 1, launcher.stderr
    for rank, pid in pids.items():
        assert f"rank {rank} (pid {pid}) was killed by SIGKILL" in launcher.stderr


@linux_only
def test_no_orphans_when_the_launcher_is_killed(serve) -> None:
    launcher = serve("--tp=2", "--dp=1")
    pids = launcher.child_pids(2)
    launcher.wait_ready(2, 1)

    launcher.process.kill()
    launcher.process.wait()

    survivors = wait_gone(list(pids.values()), timeout=3)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, launcher.stderr


@linux_only
def test_a_bad_config_fails_before_starting_anything() -> None:
    command = [sys.executable, "-m", "aioworker.cli.main", "serve", "--fake-executor", "--tp=0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "parallel.tensor_parallel_size is 0" in result.stderr
    assert "started rank" not in result.stderr


@pytest.mark.parametrize("path", sorted(CONFIGS_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_load(path: Path) -> None:
    load_config(path)
