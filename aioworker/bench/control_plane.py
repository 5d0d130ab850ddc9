"""The control plane alone: a real worker process whose executor returns at once.

Measures, over loopback ipc: requests/s ingested end to end (a burst, one token each),
submit-to-first-output latency (p50, p99, one request at a time), and the driver loop's own
time per step with 256 running requests. Baselines from the same run: an echo process that
waits on its socket (the floor of any ZeroMQ request path) and one that polls with a 1 ms
sleep (the classic loop this project replaces), both behind the same client-side code.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from aioworker.config import WorkerConfig, load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.admin_client import send as admin_send
from aioworker.wire.client import Client
from aioworker.wire.health import RankState
from aioworker.wire.protocol import RESULT_DECODER, AdminRequest, SubmitRequest, encode
from aioworker.wire.transport import client_reply_endpoint, group_endpoints

ONE_TOKEN = SamplingParams(max_tokens=1)


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float


def percentiles(samples: list[float]) -> Latency:
    ordered = sorted(samples)
    return Latency(statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3)


def bench_config() -> WorkerConfig:
    return load_config(
        overrides={
            "runtime.name": f"bench{uuid.uuid4().hex[:8]}",
            "runtime.runtime_dir": tempfile.mkdtemp(prefix="aioworker-bench-"),
            "scheduler.max_num_seqs": 1024,
            "scheduler.max_num_batched_tokens": 65536,
            "cache.num_blocks": 300000,
            "model.max_model_len": 100000,
        }
    )


def worker_set_args(config: WorkerConfig) -> list[str]:
    """The --set options that give a process the benchmark's configuration."""
    sets = {
        "runtime.name": config.runtime.name,
        "runtime.runtime_dir": config.runtime.runtime_dir,
        "scheduler.max_num_seqs": config.scheduler.max_num_seqs,
        "scheduler.max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        "cache.num_blocks": config.cache.num_blocks,
        "model.max_model_len": config.model.max_model_len,
    }
    return [a for k, v in sets.items() for a in ("--set", f"{k}={msgspec.json.encode(v).decode()}")]


def start_worker(config: WorkerConfig, step_ms: float = 0.0) -> subprocess.Popen:
    args = worker_set_args(config)
    command = [
        sys.executable,
        "-m",
        "aioworker.cli.main",
        "worker",
        "--rank",
        "0",
        "--fake-executor",
        "--fake-step-ms",
        str(step_ms),
        *args,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = admin_send(config, 0, AdminRequest(command="status"), 0.5).reply
        if reply.ok and reply.data.get("state") == RankState.READY:
            return process
    process.kill()
    raise RuntimeError("the benchmark worker did not become READY within 30 s")


async def worker_latency(config: WorkerConfig, num: int) -> Latency:
    samples = []
    async with Client.from_config(config) as client:
        for _ in range(num):
            started = time.perf_counter()
            stream = await client.submit([1, 2, 3, 4], ONE_TOKEN)
            async for _ in stream:
                samples.append(time.perf_counter() - started)
                break
            async for _ in stream:
                pass
    return percentiles(samples[num // 10 :])  # the first tenth warms up


async def worker_burst(config: WorkerConfig, num: int) -> float:
    async with Client.from_config(config) as client:
        started = time.perf_counter()
        streams = [await client.submit([1, 2, 3, 4], ONE_TOKEN) for _ in range(num)]
        for stream in streams:
            async for _ in stream:
                pass
        return num / (time.perf_counter() - started)


async def loop_time_at(config: WorkerConfig, num_running: int, seconds: float) -> dict:
    """The driver's own time per step with `num_running` decoding. Outputs are read raw and
    dropped, so this process takes as little of the machine as it can."""
    context = zmq.asyncio.Context()
    push = context.socket(zmq.PUSH)
    push.connect(group_endpoints(config.runtime, 0, 1).tasks)
    pull = context.socket(zmq.PULL)
    reply_to = client_reply_endpoint(config.runtime)
    pull.bind(reply_to)
    long = SamplingParams(max_tokens=90000, ignore_eos=True)
    for i in range(num_running):
        message = SubmitRequest(
            request_id=f"r{i}", prompt_token_ids=[1, 2, 3, 4], params=long, reply_to=reply_to
        )
        await push.send_multipart(encode(message))

    async def drain() -> None:
        while True:
            await pull.recv_multipart()

    reader = asyncio.ensure_future(drain())
    await asyncio.sleep(seconds)
    data = admin_send(config, 0, AdminRequest(command="status"), 5.0).reply.data
    admin_send(config, 0, AdminRequest(command="shutdown"), 5.0)
    reader.cancel()
    push.close(linger=0)
    pull.close(linger=0)
    context.term()
    return data


async def echo_latency(task_endpoint: str, reply_endpoint: str, num: int) -> Latency:
    context = zmq.asyncio.Context()
    push = context.socket(zmq.PUSH)
    push.connect(task_endpoint)
    pull = context.socket(zmq.PULL)
    pull.bind(reply_endpoint)
    samples = []
    for i in range(num):
        message = SubmitRequest(
            request_id=str(i),
            prompt_token_ids=[1, 2, 3, 4],
            params=ONE_TOKEN,
            reply_to=reply_endpoint,
        )
        started = time.perf_counter()
        await push.send_multipart(encode(message))
        RESULT_DECODER.decode(await pull.recv_multipart())
        samples.append(time.perf_counter() - started)
    push.close(linger=0)
    pull.close(linger=0)
    context.term()
    return percentiles(samples[num // 10 :])


def baseline_latency(config: WorkerConfig, mode: str, num: int) -> Latency:
    base = f"ipc://{config.runtime.runtime_dir}/echo-{mode}"
    server = subprocess.Popen(
        [sys.executable, "-m", "aioworker.bench.echo_server", mode, f"{base}-tasks"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        server.stdout.readline()  # "ready"
        return asyncio.run(echo_latency(f"{base}-tasks", f"{base}-replies", num))
    finally:
        server.kill()
        server.wait()


def run(
    num_latency: int = 2000, num_burst: int = 20000, num_running: int = 256
) -> dict[str, object]:
    config = bench_config()
    worker = start_worker(config)
    try:
        latency = asyncio.run(worker_latency(config, num_latency))
        throughput = asyncio.run(worker_burst(config, num_burst))
    finally:
        worker.kill()
        worker.wait()
    # Steady decoding of 256 requests: steps of 2 ms keep the token rate one client can read;
    # the loop's own time is measured around the step, so the step's length does not enter it.
    config = bench_config()
    worker = start_worker(config, step_ms=2.0)
    try:
        status = asyncio.run(loop_time_at(config, num_running, 1.5))
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    return {
        "latency": latency,
        "requests_per_s": throughput,
        "loop_us_per_step": status["loop_us_per_step"],
        "loop_cpu_us_per_step": status["loop_cpu_us_per_step"],
        "num_running": status["num_running"],
        "echo_event": baseline_latency(config, "event", num_latency),
        "echo_poll": baseline_latency(config, "poll", num_latency),
        "endpoint": client_reply_endpoint(config.runtime).rsplit("/", 1)[0],
        "tasks": group_endpoints(config.runtime, 0, 1).tasks,
    }
