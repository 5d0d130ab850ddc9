"""Run W9 on a GPU and format its tables (`aioworker bench --workload w9`): the chat with the
host KV tier off and on (gpu_host_tier.py) on the Llama-3.1-8B shape, the tier's copy rates
beside plain pinned copies measured in the same run, and W1 with the tier on against off: what
the tier costs where nothing is reused."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from aioworker.bench import gpu, gpu_host_tier
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config
from aioworker.config import CacheOptions

BLOCK_SIZE = CacheOptions().block_size
PINNED_COPY_BYTES = 1 << 30
# W1 with the tier on: a tier of this size, every freed block saved to it (and the oldest
# evicted once it is full), none ever loaded back.
W1_HOST_KV_BYTES = 16 << 30
W1_REPEATS = 3


def _say(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class PinnedCopies:
    """Bytes a second of one plain copy of PINNED_COPY_BYTES each way (median of 5)."""

    host_to_device: float
    device_to_host: float


def measure_pinned_copies() -> PinnedCopies:
    copies = _time_pinned_copies()
    gpu.release_cached_memory()  # the tensors went with the call: the engines get the memory
    return copies


def _time_pinned_copies() -> PinnedCopies:
    host = torch.empty(PINNED_COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(PINNED_COPY_BYTES, dtype=torch.uint8, device="cuda")
    load = gpu._time_cuda(lambda: device.copy_(host, non_blocking=True), 5)
    save = gpu._time_cuda(lambda: host.copy_(device, non_blocking=True), 5)
    return PinnedCopies(PINNED_COPY_BYTES / load, PINNED_COPY_BYTES / save)


def chat_both_ways(scale: gpu_host_tier.ChatScale) -> gpu_host_tier.BothWays:
    cfg = load_model_config(gpu.LLAMA_8B)
    block_bytes = gpu.kv_bytes_per_token(cfg) * BLOCK_SIZE

    def make_engine(**overrides):
        return gpu.make_engine(gpu.LLAMA_8B, overrides["model.max_model_len"], **overrides)

    return gpu_host_tier.both_ways(make_engine, gpu.free, scale, BLOCK_SIZE, block_bytes, _say)


@dataclass
class W1Side:
    tokens_per_s: list[float]
    num_output_tokens: int
    tier_counts: dict[str, float]


def w1_side(host_kv_bytes: int) -> W1Side:
    """W1's draws and engine (gpu_run.run_w1), with `cache.host_kv_bytes` set; both tiers
    forget the last run's blocks before each run (w1_tokens_per_s empties the prefix cache), so
    nothing is reused across runs."""
    engine = gpu.make_engine(gpu.QWEN3_06B, 2048, **{"cache.host_kv_bytes": host_kv_bytes})
    rates = []
    for repeat in range(W1_REPEATS):
        rate, total = gpu.w1_tokens_per_s(engine)
        rates.append(rate)
        _say(f"W1 host tier {host_kv_bytes >> 30} GiB, run {repeat + 1}: {rate:,.0f} tok/s")
    counts = engine.scheduler.connector.stats()
    gpu.free(engine)
    return W1Side(rates, total, counts)


def run(scale: gpu_host_tier.ChatScale) -> tuple[str, str]:
    pinned = measure_pinned_copies()
    _say(
        f"pinned copies of {PINNED_COPY_BYTES >> 30} GiB: host to device "
        f"{pinned.host_to_device / 1e9:.1f} GB/s, device to host {pinned.device_to_host / 1e9:.1f} GB/s"
    )
    chat = chat_both_ways(scale)
    w1_off, w1_on = w1_side(0), w1_side(W1_HOST_KV_BYTES)
    tables = [
        chat_table(chat, scale),
        copies_table(chat.on.tier_counts, pinned),
        w1_table(w1_off, w1_on),
    ]
    return "\n\n".join(tables), notes(chat, scale, w1_off, w1_on)


def chat_table(chat: gpu_host_tier.BothWays, scale: gpu_host_tier.ChatScale) -> str:
    off, on = chat.off, chat.on
    rows = [
        [name, f"{r.output_tokens_per_s:,.0f}", f"{r.mean_ttft_s:.2f}", f"{r.p99_ttft_s:.2f}"]
        for name, r in (("host tier off", off), ("host tier on", on))
    ]
    rows.append([
        "on against off",
        f"{on.output_tokens_per_s / off.output_tokens_per_s:.2f}x (goal >= 2x)",
        f"{off.mean_ttft_s / on.mean_ttft_s:.1f}x lower (goal >= 3x)",
        f"{off.p99_ttft_s / on.p99_ttft_s:.1f}x lower",
    ])  # fmt: skip
    title = f"W9 chat, {scale.num_users} users x {scale.num_turns} turns, Llama-3.1-8B"
    return format_table([title, "output tok/s", "mean TTFT s", "p99 TTFT s"], rows)


def copies_table(counts: dict[str, float], pinned: PinnedCopies) -> str:
    rows = []
    for name, moved, ms, plain in (
        ("device to host (saves)", "host_kv_bytes_saved", "host_kv_ms_saving", pinned.device_to_host),
        ("host to device (loads)", "host_kv_bytes_loaded", "host_kv_ms_loading", pinned.host_to_device),
    ):  # fmt: skip
        num_bytes, seconds = counts[moved], counts[ms] / 1e3
        rate = num_bytes / seconds if seconds else 0.0
        rows.append([
            name, f"{num_bytes / 2**30:,.1f}", f"{seconds:.2f}", f"{rate / 1e9:.1f}",
            f"{plain / 1e9:.1f}", f"{rate / plain:.0%}",
        ])  # fmt: skip
    header = ["W9 host tier copies", "GiB", "copy s", "GB/s", "pinned 1 GiB copy GB/s", "of it"]
    return format_table(header, rows)


def w1_table(off: W1Side, on: W1Side) -> str:
    rows = [
        [name, f"{statistics.median(side.tokens_per_s):,.0f}", _listed(side.tokens_per_s)]
        for name, side in (
            ("host tier off", off),
            (f"host tier on ({W1_HOST_KV_BYTES >> 30} GiB)", on),
        )
    ]
    return format_table(["W1 (Qwen3-0.6B), nothing reused", "output tok/s (median)", "runs"], rows)


def notes(
    chat: gpu_host_tier.BothWays, scale: gpu_host_tier.ChatScale, w1_off: W1Side, w1_on: W1Side
) -> str:
    off, on, counts = chat.off, chat.on, chat.on.tier_counts
    pairs = [
        (a, b)
        for u, v in zip(off.answers, on.answers, strict=True)
        for a, b in zip(u, v, strict=True)
    ]
    w1_ratio = statistics.median(w1_on.tokens_per_s) / statistics.median(w1_off.tokens_per_s)
    config_bytes = chat.sizing.block_bytes
    engine_bytes = (
        "" if on.kv_block_bytes == config_bytes else f" (the engine: {on.kv_block_bytes:,})"
    )
    return (
        f"W9: each user a {scale.system_tokens:,}-token system prompt, messages of "
        f"{scale.message_tokens[0]} to {scale.message_tokens[1]} tokens, {scale.new_tokens} greedy "
        f"tokens a turn, all users at once, each user's next turn added when its answer ends; "
        f"{chat.sizing.describe()}{engine_bytes}. Off first, then on, each on an engine of its "
        f"own, same draws; {on.num_output_tokens:,} output tokens a side. Mean TTFT by turn, off: "
        f"{_seconds(off.mean_ttft_by_turn())}; on: {_seconds(on.mean_ttft_by_turn())}. Tier: "
        f"{counts['host_kv_hit_blocks']:,} blocks hit on the host, {counts['host_kv_saved_blocks']:,} "
        f"saved, {counts['host_kv_swaps_out']:,} swaps out and {counts['host_kv_swaps_in']:,} in, "
        f"{counts['host_kv_copy_failures']} copies failed; preemptions off {off.num_preemptions:,}, "
        f"on {on.num_preemptions:,}. Turns whose greedy answers are the same on both sides: "
        f"{sum(a == b for a, b in pairs):,} of {len(pairs):,} (bf16; the sides batch differently). "
        f"Copies: the tier's bytes over the time its copies took on their stream; beside one plain "
        f"torch copy of a {PINNED_COPY_BYTES >> 30} GiB pinned tensor. W1 with the tier on against "
        f"off: {w1_ratio:.3f} of the output tokens/s (goal within 2%); each side its own engine, "
        f"off first, {W1_REPEATS} runs each, both tiers reset before each run; over its runs the "
        f"tier saved {w1_on.tier_counts['host_kv_saved_blocks']:,} blocks and hit "
        f"{w1_on.tier_counts['host_kv_hit_blocks']:,}; {w1_on.num_output_tokens:,} output tokens "
        "a run."
    )


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) + " s"


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)
