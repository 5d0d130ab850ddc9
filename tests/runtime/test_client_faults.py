"""Clients against workers that die, or that were never there, and clients interrupted: nothing
waits forever and nothing computes for nobody."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.workers import admin, deployment, start_worker, stop, wait_ready

LONG = SamplingParams(max_tokens=100000)


def communicate_or_dump(process: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    """The process's output once it exits within `timeout_s`; else fail with where each of its
    threads stands (its faulthandler's dump on SIGABRT: PYTHONFAULTHANDLER=1 in its env)."""
    try:
        return process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, stderr = process.communicate(timeout=30)
        raise AssertionError(
            f"still running {timeout_s:g} s after SIGINT; its threads:\n{stderr}"
        ) from None


def test_a_killed_driver_ends_its_clients_streams_within_3_intervals() -> None:
    config, set_args = deployment()
    interval = config.runtime.heartbeat_interval_s
    worker = start_worker(0, set_args, "--fake-executor", "--fake-step-ms", "20")
    try:
        wait_ready(config, [worker])

        async def scenario():
            async with Client.from_config(config) as client:
                streams = [await client.submit([1, 2, 3], LONG) for _ in range(8)]
                for stream in streams:
                    await stream.__anext__()
                await asyncio.sleep(2 * interval)  # the client has heard the group beat
                worker.kill()
                killed_at = time.monotonic()
                ends = [[out async for out in stream][-1] for stream in streams]
                return ends, time.monotonic() - killed_at

        ends, waited = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        stop([worker])
    assert all(end.finish_reason == "error" and "no heartbeat" in end.error for end in ends)
    assert waited <= 3 * interval + interval  # 3 intervals, and one beat of slack


def test_generate_connect_to_nothing_fails_within_seconds(tmp_path) -> None:
    config, set_args = deployment(**{"runtime.runtime_dir": str(tmp_path)})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "aioworker.cli.main", "generate", "--connect", *set_args]
        + ["--prompt-token-ids", "[1, 2, 3]", "--max-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 15
    assert done.returncode == 1 and "no heartbeat" in done.stderr


def test_ctrl_c_on_generate_connect_aborts_its_request(tmp_path) -> None:
    config, set_args = deployment()
    worker = start_worker(0, set_args, "--fake-executor", "--fake-step-ms", "20")
    try:
        wait_ready(config, [worker])
        # SIGINT as a terminal's foreground process gets it. A shell starts background jobs with
        # SIGINT ignored, and an ignored signal stays ignored across exec, so a suite run in the
        # background (`pytest &`, nohup) would hand the child a Ctrl-C it never sees; a handler
        # in this process (reset to the default on exec) prevents that.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            generate = subprocess.Popen(
                [sys.executable, "-m", "aioworker.cli.main", "generate", "--connect", *set_args]
                + ["--prompt-token-ids", "[1, 2, 3]", "--max-tokens", "100000", "--json"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        while admin(config, "status").data["num_requests"] == 0:
            time.sleep(0.05)
        os.kill(generate.pid, signal.SIGINT)
        _, stderr = communicate_or_dump(generate, 20)
        interrupted_at = time.monotonic()
        while (
            admin(config, "status").data["num_requests"] and time.monotonic() - interrupted_at < 3
        ):
            time.sleep(0.05)
        status = admin(config, "status").data
    finally:
        stop([worker])
    assert generate.returncode == 130 and "Traceback" not in stderr
    assert status["num_requests"] == 0 and status["kv_blocks_used"] == 0
