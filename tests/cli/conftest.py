"""Fake workers in states the control tools must tell apart: loading and draining."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.admin_client import send
from aioworker.wire.client import Client
from aioworker.wire.protocol import AdminRequest
from tests.cli_workers import Worker, Workers, wait_for_state

# Steps this slow keep one long request in flight for minutes: longer than any test module.
SLOW_STEP_MS = 50
LONG_REQUEST = SamplingParams(max_tokens=4000, ignore_eos=True)


@pytest.fixture(scope="module")
def loading_worker(workers: Workers) -> Worker:
    """The driver of a TP=2 group whose peer never starts: it beats LOADING while it waits."""
    return workers.start(until="LOADING", extra={"parallel.tensor_parallel_size": 2})


@pytest.fixture(scope="module")
def draining_worker(workers: Workers):
    """A worker told to drain with a long deadline while a slow request runs: it beats DRAINING
    (and refuses every new request) until the module's tests are done. The request's client
    reads its outputs on a thread meanwhile: a client that stops reading is given up."""
    worker = start_slow_worker(workers)
    running, stop = threading.Event(), threading.Event()
    reader = threading.Thread(target=asyncio.run, args=(read_long_request(worker, running, stop),))
    reader.start()
    assert running.wait(30)
    drain = AdminRequest(command="drain", argument="600")
    result = send(worker.config, 0, drain, timeout_s=5.0)
    assert result.reply.ok, result.reply.message
    wait_for_state(worker, "DRAINING")
    yield worker
    stop.set()
    reader.join(30)


def start_slow_worker(workers: Workers) -> Worker:
    """Like Workers.start (which passes no worker options), with steps of SLOW_STEP_MS."""
    worker = workers.deployment()
    worker.log_path = workers.directory / f"{worker.overrides['runtime.name']}.log"
    command = [sys.executable, "-m", "aioworker.cli.main", "worker", "--rank", "0"]
    command += ["--fake-executor", "--fake-step-ms", str(SLOW_STEP_MS), *worker.args]
    with worker.log_path.open("w") as log:
        worker.process = subprocess.Popen(command, stdout=log, stderr=log)
    workers.started.append(worker)
    wait_for_state(worker, "READY")
    return worker


async def read_long_request(
    worker: Worker, running: threading.Event, stop: threading.Event
) -> None:
    """Run LONG_REQUEST, reading its outputs, until `stop` is set."""
    async with Client.from_config(worker.config) as client:
        stream = await client.submit([1, 2, 3], LONG_REQUEST)
        await stream.__anext__()
        running.set()
        while not stop.is_set():
            await asyncio.wait_for(stream.__anext__(), 30)
