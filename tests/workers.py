"""Start real worker processes for tests, wait until they serve, and always stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager

from aioworker.config import WorkerConfig, load_config
from aioworker.wire.protocol import AdminRequest

# Fast enough that a lost peer shows within a second (3 missed beats), slow enough that a busy
# 2-core machine does not lose one: at 0.2 s, a rank of a tensor-parallel pair went 0.6 s
# without beating in 2 of 3 local suite runs. Those silences came from loading (importing torch
# holds the GIL for up to 0.95 s on a busy 2-core host), where 10 intervals are allowed now.
FAST_BEATS = {"runtime.heartbeat_interval_s": 0.3}


def deployment(**overrides) -> tuple[WorkerConfig, list[str]]:
    """A config with a unique runtime.name, and the --set arguments that give it to a process."""
    settings = {
        "runtime.name": f"t{uuid.uuid4().hex[:8]}",
        **FAST_BEATS,
        "model.dtype": "float32",  # as the in-process engines (conftest.EMBEDDED_OVERRIDES say why)
        **overrides,
    }
    args = [item for key, value in settings.items() for item in ("--set", f"{key}={_toml(value)}")]
    return load_config(overrides=settings), args


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


# The workers' logs, removed when the test process exits (one file a worker started: a suite
# run starts hundreds, which would otherwise stay in /tmp).
_LOGS = tempfile.TemporaryDirectory(prefix="aioworker-test-logs-")


def start_worker(rank: int, set_args: list[str], *extra: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "aioworker.cli.main",
        "worker",
        "--rank",
        str(rank),
        *set_args,
        *extra,
    ]
    # The log goes to a file: a pipe nobody reads would fill up and block the worker.
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, read after the worker ends
        prefix=f"aioworker-r{rank}-", suffix=".log", dir=_LOGS.name, delete=False
    )
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    process.log_path = log.name
    log.close()
    return process


def read_log(process: subprocess.Popen) -> str:
    with open(process.log_path) as handle:
        return handle.read()


def admin(
    config: WorkerConfig,
    command: str,
    argument: str = "",
    group: int = 0,
    timeout: float = 5.0,
    **fields,
):
    """One admin request (any AdminRequest fields), or None after `timeout` seconds."""
    from aioworker.wire.admin_client import send

    reply = send(config, group, AdminRequest(command=command, argument=argument, **fields), timeout)
    return reply.reply if reply.is_reachable else None


def wait_ready(
    config: WorkerConfig, processes: list[subprocess.Popen], timeout: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout
    groups = range(config.parallel.data_parallel_size)
    pending = set(groups)
    while pending and time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"worker exited with {process.returncode}: {read_log(process)[-2000:]}"
                )
        for group in list(pending):
            reply = admin(config, "status", group=group, timeout=0.5)
            if reply is not None and reply.data.get("state") == "READY":
                pending.discard(group)
        time.sleep(0.05)
    if pending:
        raise TimeoutError(f"groups {sorted(pending)} not READY after {timeout}s")


def stop(processes: list[subprocess.Popen], timeout: float = 20.0) -> list[int]:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


@contextmanager
def running(config: WorkerConfig, set_args: list[str], *extra: str, ranks: list[int] | None = None):
    ranks = list(range(config.world_size)) if ranks is None else ranks
    processes = [start_worker(rank, set_args, *extra) for rank in ranks]
    try:
        wait_ready(config, processes)
        yield processes
    finally:
        stop(processes)


def kill(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    os.kill(process.pid, sig)
