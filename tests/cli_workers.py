"""Fake-executor workers for the control-tool tests (`aioworker admin`, `aioworker top`):
started under unique deployment names, killed at teardown."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aioworker.cli.main import main
from aioworker.cli.top import BeatReceiver, heartbeat_endpoints
from aioworker.config import WorkerConfig, load_config

HEARTBEAT_INTERVAL_S = 0.2


@dataclass
class Worker:
    """One rank-0 worker process (or just a deployment name, when nothing was started)."""

    overrides: dict[str, Any]
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def args(self) -> list[str]:
        """The --set options that point a tool at this worker's deployment."""
        return [arg for key, value in self.overrides.items() for arg in ("--set", f"{key}={value}")]

    @property
    def config(self) -> WorkerConfig:
        return load_config(overrides=self.overrides)

    def log_tail(self) -> str:
        return self.log_path.read_text()[-2000:] if self.log_path else ""


@dataclass
class Workers:
    """Starts fake workers under unique deployment names; kill_all() at teardown."""

    directory: Path
    started: list[Worker] = field(default_factory=list)

    def deployment(self, extra: dict[str, Any] | None = None) -> Worker:
        name = f"cli{uuid.uuid4().hex[:10]}"
        overrides = {
            "runtime.name": name,
            "runtime.runtime_dir": str(self.directory / "run"),
            "runtime.heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
            **(extra or {}),
        }
        return Worker(overrides)

    def start(self, until: str = "READY", extra: dict[str, Any] | None = None) -> Worker:
        """A rank-0 fake worker, once it beats with state `until`."""
        worker = self.deployment(extra)
        worker.log_path = self.directory / f"{worker.overrides['runtime.name']}.log"
        command = [sys.executable, "-m", "aioworker.cli.main", "worker", "--rank", "0"]
        with worker.log_path.open("w") as log:
            worker.process = subprocess.Popen(
                [*command, "--fake-executor", *worker.args], stdout=log, stderr=log
            )
        self.started.append(worker)
        wait_for_state(worker, until)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()


def wait_for_state(worker: Worker, state: str, timeout_s: float = 10.0) -> None:
    endpoint = heartbeat_endpoints(worker.config)[(0, 0)]
    deadline = time.monotonic() + timeout_s
    with BeatReceiver([endpoint]) as receiver:
        while time.monotonic() < deadline:
            assert worker.process.poll() is None, f"worker exited:\n{worker.log_tail()}"
            beat = receiver.receive(timeout_s=0.2)
            if beat is not None and beat.state == state:
                return
    raise AssertionError(f"worker never beat {state} within {timeout_s}s:\n{worker.log_tail()}")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `aioworker ARGV` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
