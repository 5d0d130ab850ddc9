"""`aioworker bench --workload serve`: the whole service (`aioworker serve --api-port`, the
model on this machine's CPU) under a serving load, on a quiet machine and beside one foreign
busy process, against the offline engine on the same prompts (what serving costs).

The load: NUM_PROMPTS random prompts of PROMPT_TOKENS tokens (random token ids decoded to
text, drawn anew for every run so that the prefix cache never serves one run from another),
OUTPUT_TOKENS tokens out each (ignore_eos), CONCURRENCY streamed requests at a time, greedy.
Each side runs REPEATS times in alternating order; the tables give medians.
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from aioworker.bench.api import wait_healthy
from aioworker.bench.serve_load import LoadResult, ServeLoad, run_load

NUM_PROMPTS = 64
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 64
CONCURRENCY = 16
REPEATS = 3
SERVING = re.compile(r"aioworker api: serving '([^']*)' on http://([\d.]+):(\d+)")


@dataclass
class Service:
    process: subprocess.Popen
    host: str
    port: int
    model: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_service(config_argv: list[str]) -> Service:
    """`aioworker serve --api-port 0` under its own deployment name, READY and healthy."""
    isolated = [
        f"--set=runtime.name=bench{uuid.uuid4().hex[:8]}",
        f"--set=runtime.runtime_dir={tempfile.mkdtemp(prefix='aioworker-bench-')}",
    ]
    command = [sys.executable, "-m", "aioworker.cli.main", "serve", "--api-port", "0"]
    process = subprocess.Popen(
        [*command, *config_argv, *isolated], stderr=subprocess.PIPE, text=True
    )
    for line in process.stderr:
        if match := SERVING.search(line):
            service = Service(process, match[2], int(match[3]), match[1])
            threading_drain(process)
            wait_healthy(service.host, service.port, timeout=600)
            return service
    process.wait()
    raise RuntimeError(f"aioworker serve exited {process.returncode} before its API started")


def threading_drain(process: subprocess.Popen) -> None:
    """Keep reading the service's stderr so its pipe never fills."""
    import threading

    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()


def draw_prompts(tokenizer, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = tokenizer.vocab_size
    return [
        tokenizer.decode([rng.randrange(vocab) for _ in range(PROMPT_TOKENS)])
        for _ in range(NUM_PROMPTS)
    ]


class BusyProcess:
    """One foreign process that keeps one core busy, as another tenant of the host would."""

    def __enter__(self) -> BusyProcess:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def measure(service: Service, endpoint: str, prompts: list[str], busy: bool) -> LoadResult:
    load = ServeLoad(endpoint, service.model, prompts, OUTPUT_TOKENS, CONCURRENCY)
    if not busy:
        return asyncio.run(run_load(service.host, service.port, load))
    with BusyProcess():
        return asyncio.run(run_load(service.host, service.port, load))


def run_serving(config_argv: list[str], tokenizer, endpoints: list[str]) -> dict:
    """{(endpoint, "quiet" | "busy"): [LoadResult per run]}; quiet and busy alternate."""
    runs: dict[tuple[str, str], list[LoadResult]] = {}
    service = start_service(config_argv)
    seeds = iter(range(1, 1000))
    try:
        warm = ServeLoad("completions", service.model, draw_prompts(tokenizer, 0)[:8], 8, 8)
        asyncio.run(run_load(service.host, service.port, warm))
        for repeat in range(REPEATS):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for endpoint in endpoints:
                for busy in order:
                    result = measure(service, endpoint, draw_prompts(tokenizer, next(seeds)), busy)
                    runs.setdefault((endpoint, "busy" if busy else "quiet"), []).append(result)
    finally:
        service.stop()
    return runs


def run_offline(engine, tokenizer) -> list[float]:
    """Output tokens/s of the offline engine on the same kind of prompts, CONCURRENCY at a time."""
    from aioworker.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
    rates = []
    for repeat in range(REPEATS):
        prompts = [tokenizer.encode(p) for p in draw_prompts(tokenizer, 2000 + repeat)]
        started = time.perf_counter()
        for first in range(0, NUM_PROMPTS, CONCURRENCY):
            engine.generate(prompts[first : first + CONCURRENCY], params)
        rates.append(NUM_PROMPTS * OUTPUT_TOKENS / (time.perf_counter() - started))
    return rates


def report(runs: dict, offline: list[float]) -> tuple[list[str], list[list[str]], str]:
    """The table's header and rows, and its notes."""
    import statistics

    def cell(results: list[LoadResult], value) -> str:
        values = [value(r) for r in results]
        return f"{statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"

    header = ["endpoint, machine", "output tok/s (runs)", "TTFT p50 ms", "ITL p50 ms"]
    rows = []
    for (endpoint, side), results in runs.items():
        rows.append(
            [
                f"{endpoint}, {side}",
                cell(results, lambda r: r.output_tokens_per_s),
                cell(results, lambda r: r.ttft_p50_ms),
                cell(results, lambda r: r.itl_p50_ms),
            ]
        )
    offline_median = statistics.median(offline)
    rows.append(
        [
            "offline engine, quiet",
            f"{offline_median:.1f} ({', '.join(f'{v:.1f}' for v in offline)})",
            "",
            "",
        ]
    )
    ratios = []
    for endpoint in dict.fromkeys(e for e, _ in runs):
        quiet = statistics.median(r.output_tokens_per_s for r in runs[(endpoint, "quiet")])
        busy = statistics.median(r.output_tokens_per_s for r in runs[(endpoint, "busy")])
        ratios.append(
            f"{endpoint}: busy/quiet {busy / quiet:.2f}x, serving/offline {quiet / offline_median:.2f}x"
        )
    notes = (
        f"`aioworker serve --api-port 0` on this machine; {NUM_PROMPTS} prompts of "
        f"{PROMPT_TOKENS} random token ids decoded to text (new draws every run), "
        f"{OUTPUT_TOKENS} tokens out (ignore_eos, greedy), {CONCURRENCY} streamed requests at a "
        f"time from a lean asyncio HTTP client in the benchmark's process. busy: one foreign "
        f"process spinning on one core for the whole run. Medians of {REPEATS} runs per side, "
        f"quiet and busy alternating. The offline engine runs the same kind of prompts "
        f"{CONCURRENCY} at a time in the benchmark's process. " + "; ".join(ratios) + "."
    )
    return header, rows, notes
