"""`aioworker serve` supervising fake-executor ranks: clean stop, teardown on a failure, no orphans;
and every shipped config loads."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import zmq

from aioworker.config import load_config
from aioworker.wire.protocol import HEARTBEAT_DECODER
from aioworker.wire.transport import all_group_endpoints
from tests.processes import Process

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
STARTED = re.compile(r"started rank (\d+) \(group (\d+)\) pid (\d+)")
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="aioworker serve is Linux-only")


class Serve(Process):
    """`aioworker serve --fake-executor` in a unique deployment, its stderr collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.name = f"test-serve-{uuid.uuid4().hex[:8]}"
        self.overrides = {"runtime.name": self.name, "runtime.heartbeat_interval_s": 0.2}
        sets = [f"--set={key}={value!r}" for key, value in self.overrides.items()]
        super().__init__(["serve", "--fake-executor", *sets, *args])

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


@pytest.fixture
def serve():
    launched: list[Serve] = []

    def start(*args: str) -> Serve:
        launched.append(Serve(*args))
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
def test_a_killed_rank_takes_the_deployment_down(serve) -> None:
    launcher = serve("--tp=1", "--dp=2")
    pids = launcher.child_pids(2)
    launcher.wait_ready(1, 2)

    os.kill(pids[1], signal.SIGKILL)

    assert launcher.wait(timeout=10) == 128 + signal.SIGKILL, launcher.stderr
    assert f"rank 1 (pid {pids[1]}) was killed by SIGKILL" in launcher.stderr
    # The survivor was sent SIGTERM and drained.
    assert f"rank 0 (pid {pids[0]}) exited with code 0" in launcher.stderr


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
