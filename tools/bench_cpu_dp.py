"""Data parallelism on one CPU host: a deployment started by `aioworker serve` answers short
requests from concurrent Python `Client`s; wall time and request latency (p50, p99).

Each --run is one configuration: `name=...,dp=N[,tree=DIR][,set.KEY=VALUE][,env.NAME=VALUE]`.
`tree` is the source tree the ranks run from (e.g. an export of an older commit), `set.` a config
override for the ranks, `env.` an environment variable of theirs. Configurations run in turn,
--repeats times in that alternating order (a noisy host drifts; each gets the same drift), and
the table gives each one's medians.

    mkdir -p /tmp/aioworker-before && git archive 0fadb4e | tar -x -C /tmp/aioworker-before
    python tools/bench_cpu_dp.py --run name=dp1-before,dp=1,tree=/tmp/aioworker-before \\
        --run name=dp1-after,dp=1 --run name=dp2-before,dp=2,tree=/tmp/aioworker-before \\
        --run name=dp2-after,dp=2
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aioworker.config import WorkerConfig, load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.admin_client import send as admin_send
from aioworker.wire.client import Client
from aioworker.wire.protocol import AdminRequest

REPO = Path(__file__).resolve().parent.parent
# Same for every configuration: a small cache and context keep start-up short.
BASE_SETTINGS = {
    "model.path": "embedded",
    "model.max_model_len": 256,
    "cache.num_blocks": 256,
}


@dataclass
class RunSpec:
    name: str
    dp: int
    tree: Path = REPO
    settings: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    wall_s: float
    p50_ms: float
    p99_ms: float
    num_requests: int

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.wall_s


def parse_run(text: str) -> RunSpec:
    fields = dict(item.split("=", 1) for item in text.split(","))
    spec = RunSpec(name=fields.pop("name"), dp=int(fields.pop("dp")))
    if "tree" in fields:
        spec.tree = Path(fields.pop("tree")).resolve()
    for key, value in fields.items():
        kind, _, name = key.partition(".")
        if kind == "set":
            spec.settings[name] = value
        elif kind == "env":
            spec.env[name] = value
        else:
            raise SystemExit(f"--run {text!r}: {key!r} is none of name, dp, tree, set.*, env.*")
    return spec


def start_serve(spec: RunSpec, runtime_name: str, log: Path) -> subprocess.Popen:
    settings = {**BASE_SETTINGS, **spec.settings, "runtime.name": runtime_name}
    sets = [f"--set={key}={_toml(str(value))}" for key, value in settings.items()]
    command = [sys.executable, "-m", "aioworker.cli.main", "serve", f"--dp={spec.dp}", *sets]
    env = {**os.environ, **spec.env, "PYTHONPATH": str(spec.tree)}
    with open(log, "w") as out:
        # cwd too: `python -m` puts the working directory first on sys.path.
        return subprocess.Popen(
            command, cwd=spec.tree, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _toml(value: str) -> str:
    return value if value.replace(".", "").isdigit() or value in ("true", "false") else f'"{value}"'


def wait_ready(config: WorkerConfig, serve: subprocess.Popen, log: Path) -> None:
    pending = set(range(config.parallel.data_parallel_size))
    deadline = time.monotonic() + 180
    while pending:
        if serve.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the deployment did not start:\n{log.read_text()[-2000:]}")
        for group in list(pending):
            reply = admin_send(config, group, AdminRequest(command="status"), 0.5).reply
            if reply is not None and reply.data.get("state") == "READY":
                pending.discard(group)
        time.sleep(0.1)


def stop_serve(serve: subprocess.Popen) -> None:
    serve.send_signal(signal.SIGTERM)
    try:
        serve.wait(60)
    except subprocess.TimeoutExpired:
        serve.kill()
        serve.wait()


async def drive(
    config: WorkerConfig, prompts: list[list[int]], num_clients: int, params: SamplingParams
) -> tuple[float, list[float]]:
    """Each client sends its share of the prompts one after another (one request in flight per
    client); returns the wall time and every request's latency."""
    latencies: list[float] = []

    async def one_client(client: Client, share: list[list[int]]) -> None:
        for prompt in share:
            started = time.perf_counter()
            await client.generate(prompt, params)
            latencies.append(time.perf_counter() - started)

    clients = [Client.from_config(config) for _ in range(num_clients)]
    for client in clients:
        await client.start()
    try:
        started = time.perf_counter()
        shares = [prompts[i::num_clients] for i in range(num_clients)]
        await asyncio.gather(*(one_client(c, s) for c, s in zip(clients, shares, strict=True)))
        return time.perf_counter() - started, latencies
    finally:
        for client in clients:
            await client.close()


def measure(spec: RunSpec, args: argparse.Namespace, prompts: list[list[int]]) -> Result:
    runtime_name = f"bench{uuid.uuid4().hex[:8]}"
    overrides = {
        "runtime.name": runtime_name,
        "parallel.data_parallel_size": spec.dp,
        **BASE_SETTINGS,
    }
    config = load_config(overrides=overrides)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    log = Path(tempfile.gettempdir()) / f"bench_cpu_dp-{spec.name}-{runtime_name}.log"
    serve = start_serve(spec, runtime_name, log)
    try:
        wait_ready(config, serve, log)
        asyncio.run(drive(config, prompts[: args.clients * 4], args.clients, params))  # warm-up
        wall_s, latencies = asyncio.run(drive(config, prompts, args.clients, params))
    finally:
        stop_serve(serve)
    cuts = statistics.quantiles(latencies, n=100)
    return Result(wall_s, cuts[49] * 1000, cuts[98] * 1000, len(latencies))


def median_row(name: str, results: list[Result]) -> str:
    def median(values) -> float:
        return statistics.median(values)

    wall = median(r.wall_s for r in results)
    p50 = median(r.p50_ms for r in results)
    p99 = median(r.p99_ms for r in results)
    rate = median(r.requests_per_s for r in results)
    return f"| {name} | {len(results)} | {wall:.1f} | {rate:.1f} | {p50:.1f} | {p99:.1f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, type=parse_run)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [
        [rng.randrange(200, 30000) for _ in range(args.prompt_len)] for _ in range(args.requests)
    ]
    print(
        f"# {datetime.date.today()}: {len(os.sched_getaffinity(0))} cores, torch "
        f"{importlib.metadata.version('torch')}; {args.requests} requests of {args.prompt_len} "
        f"tokens, max_tokens={args.max_tokens}, greedy, {args.clients} clients",
        flush=True,
    )
    results: dict[str, list[Result]] = {spec.name: [] for spec in args.run}
    for repeat in range(args.repeats):
        for spec in args.run:
            result = measure(spec, args, prompts)
            results[spec.name].append(result)
            print(
                f"repeat {repeat + 1} {spec.name}: {result.wall_s:.1f} s, "
                f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms",
                flush=True,
            )
    print("\n| configuration | runs | wall s | requests/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        print(median_row(name, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
