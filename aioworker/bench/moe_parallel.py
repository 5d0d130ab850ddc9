"""`aioworker bench --workload ep` (CPU): a MoE model's experts split across a group of two
ranks both ways, each expert split as a dense MLP (expert_parallel_size 1) against whole
experts per rank with tokens sent by all_to_all (2), on gloo. Dummy weights at a small
Qwen3-MoE shape (SHAPE); each side runs REPEATS times in alternating order, medians reported:
output tokens/s for a batch of concurrent requests, and ms per token for one request alone."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aioworker.config import WorkerConfig, load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.admin_client import send
from aioworker.wire.client import Client
from aioworker.wire.protocol import AdminRequest

SHAPE = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 512, "intermediate_size": 1024,
    "moe_intermediate_size": 256, "num_experts": 32, "num_experts_per_tok": 4,
    "norm_topk_prob": True, "num_hidden_layers": 6, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024, "torch_dtype": "float32",
}  # fmt: skip
BATCH, PROMPT_TOKENS, OUTPUT_TOKENS, REPEATS = 32, 64, 32, 3


def _settings(model_dir: Path, expert_parallel: int) -> dict:
    return {
        "runtime.name": f"ep{uuid.uuid4().hex[:8]}",
        "runtime.runtime_dir": tempfile.mkdtemp(prefix="aioworker-ep-"),
        "model.path": str(model_dir), "model.load_format": "dummy", "model.dtype": "float32",
        "model.max_model_len": 512, "cache.num_blocks": 256,
        "parallel.tensor_parallel_size": 2, "parallel.expert_parallel_size": expert_parallel,
    }  # fmt: skip


def _start(settings: dict) -> tuple[WorkerConfig, list[subprocess.Popen]]:
    args = [a for k, v in settings.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    command = [sys.executable, "-m", "aioworker.cli.main", "worker"]
    processes = [
        subprocess.Popen([*command, "--rank", str(r), *args], stderr=subprocess.DEVNULL)
        for r in range(2)
    ]
    config = load_config(overrides=settings)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        reply = send(config, 0, AdminRequest(command="status"), 0.5)
        if reply.is_reachable and reply.reply.data.get("state") == "READY":
            return config, processes
        if any(p.poll() is not None for p in processes):
            break
        time.sleep(0.1)
    _stop(processes)
    raise RuntimeError(f"the group did not become READY: {settings}")


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


async def _measure(config: WorkerConfig, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(SHAPE["vocab_size"]) for _ in range(PROMPT_TOKENS)] for _ in range(BATCH)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    async with Client.from_config(config) as client:
        await client.generate(prompts[0], SamplingParams(max_tokens=2))  # warm
        started = time.perf_counter()
        await asyncio.gather(*(client.generate(p, params) for p in prompts))
        batch_rate = BATCH * OUTPUT_TOKENS / (time.perf_counter() - started)
        started = time.perf_counter()
        await client.generate(prompts[0], params)
        alone_ms = (time.perf_counter() - started) / OUTPUT_TOKENS * 1000
    return batch_rate, alone_ms


def run() -> tuple[str, str]:
    from aioworker.bench.report import format_table

    model_dir = Path(tempfile.mkdtemp(prefix="aioworker-ep-model-"))
    (model_dir / "config.json").write_text(json.dumps(SHAPE))
    results: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    for repeat in range(REPEATS):
        for expert_parallel in (1, 2) if repeat % 2 == 0 else (2, 1):
            config, processes = _start(_settings(model_dir, expert_parallel))
            try:
                results[expert_parallel].append(asyncio.run(_measure(config, repeat)))
            finally:
                _stop(processes)
            print(f"ep={expert_parallel}: {results[expert_parallel][-1]}", flush=True)
    rows = []
    for expert_parallel, runs in results.items():
        rates, alone = [r for r, _ in runs], [a for _, a in runs]
        rows.append([
            "each expert split (ep=1)" if expert_parallel == 1 else "whole experts, all_to_all (ep=2)",
            f"{statistics.median(rates):,.0f}", f"{statistics.median(alone):.2f}",
            ", ".join(f"{r:,.0f}" for r in rates),
        ])  # fmt: skip
    header = [
        "TP=2 on the CPU (gloo)",
        f"output tok/s, {BATCH} at once",
        "ms/token alone",
        "runs tok/s",
    ]
    notes = (
        f"A Qwen3-MoE of {SHAPE['num_experts']} experts of {SHAPE['moe_intermediate_size']}, top "
        f"{SHAPE['num_experts_per_tok']}, hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} "
        f"layers, float32, dummy weights; {BATCH} requests of {PROMPT_TOKENS} tokens in, "
        f"{OUTPUT_TOKENS} out, greedy; {REPEATS} runs each side in alternating order, medians."
    )
    return format_table(header, rows), notes
