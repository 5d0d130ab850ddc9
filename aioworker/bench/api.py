"""`aioworker bench --workload api`: what the HTTP gateway adds on top of the raw ZeroMQ client,
against a fake-executor worker (no model), in the same run.

- First token: one request at a time, 1 token each, submit -> first output (raw client) against
  POST -> first server-sent event (gateway); p50 over the requests of a run.
- Streamed requests/s: CONCURRENCY connections, each request 16 tokens, streamed; the raw side
  runs the same requests through the client library.
Each side runs REPEATS times, alternating; the table gives medians of the runs.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import statistics
import subprocess
import sys
import time

from aioworker.bench.control_plane import bench_config, start_worker, worker_set_args
from aioworker.bench.http_load import StreamingConnection
from aioworker.config import WorkerConfig
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client

PROMPT = "The capital of France is"
REPEATS = 3
NUM_LATENCY = 1000
NUM_STREAMED = 3000
CONCURRENCY = 64
STREAM_TOKENS = 16


def start_gateway(config: WorkerConfig) -> tuple[subprocess.Popen, str, int]:
    command = [sys.executable, "-m", "aioworker.cli.main", "api", "--port", "0"]
    gateway = subprocess.Popen(
        [*command, *worker_set_args(config)], stderr=subprocess.PIPE, text=True
    )
    line = gateway.stderr.readline()
    match = re.search(r"http://([\d.]+):(\d+)", line)
    if not match:
        gateway.kill()
        raise RuntimeError(f"the gateway did not start: {line}{gateway.stderr.read()}")
    return gateway, match[1], int(match[2])


def wait_healthy(host: str, port: int, timeout: float = 30.0) -> None:
    """Until /health answers 200: the gateway has seen the group READY."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        try:
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.1)
    raise RuntimeError(f"the gateway at {host}:{port} was not healthy within {timeout:g}s")


def body(max_tokens: int) -> dict:
    return {
        "model": "embedded",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def gateway_first_token(host: str, port: int, num: int) -> float:
    connection = StreamingConnection(host, port)
    await connection.open()
    samples = [(await connection.post("/v1/completions", body(1)))[0] for _ in range(num)]
    connection.close()
    return statistics.median(samples[num // 10 :]) * 1e3


async def raw_first_token(client: Client, prompt: list[int], num: int) -> float:
    samples = []
    for _ in range(num):
        started = time.perf_counter()
        stream = await client.submit(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        async for _ in stream:
            samples.append(time.perf_counter() - started)
    return statistics.median(samples[num // 10 :]) * 1e3


async def gateway_streamed(host: str, port: int, num: int) -> float:
    connections = [StreamingConnection(host, port) for _ in range(CONCURRENCY)]
    await asyncio.gather(*(c.open() for c in connections))
    remaining = [num]

    async def worker(connection: StreamingConnection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await connection.post("/v1/completions", body(STREAM_TOKENS))

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return num / elapsed


async def raw_streamed(client: Client, prompt: list[int], num: int) -> float:
    params = SamplingParams(max_tokens=STREAM_TOKENS, ignore_eos=True)
    remaining = [num]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            async for _ in await client.submit(prompt, params):
                pass

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return num / (time.perf_counter() - started)


async def raw_side(config: WorkerConfig, prompt: list[int]) -> tuple[float, float]:
    async with Client.from_config(config) as client:
        await asyncio.sleep(0.5)  # the first heartbeat: the group is READY
        latency = await raw_first_token(client, prompt, NUM_LATENCY)
        rate = await raw_streamed(client, prompt, NUM_STREAMED)
    return latency, rate


async def gateway_side(host: str, port: int) -> tuple[float, float]:
    latency = await gateway_first_token(host, port, NUM_LATENCY)
    rate = await gateway_streamed(host, port, NUM_STREAMED)
    return latency, rate


def run() -> dict[str, list[float]]:
    from aioworker.checkpoint.source import resolve_model_path
    from aioworker.checkpoint.tokenizer import Tokenizer

    prompt = Tokenizer(resolve_model_path("embedded", progress=False)).encode(PROMPT)
    config = bench_config()
    worker = start_worker(config)
    gateway, host, port = start_gateway(config)
    runs: dict[str, list[float]] = {"raw_ms": [], "api_ms": [], "raw_rps": [], "api_rps": []}
    try:
        wait_healthy(host, port)
        for _ in range(REPEATS):
            latency, rate = asyncio.run(raw_side(config, prompt))
            runs["raw_ms"].append(latency)
            runs["raw_rps"].append(rate)
            latency, rate = asyncio.run(gateway_side(host, port))
            runs["api_ms"].append(latency)
            runs["api_rps"].append(rate)
    finally:
        for process in (gateway, worker):
            process.kill()
            process.wait()
    return runs
