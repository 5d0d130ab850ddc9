"""`aioworker bench --workload spec`: speculative decoding on against off, on one engine in the
same run (the scheduler's speculator is switched off for the baseline side).

copy: batch 1, one request at a time, on a copy-heavy task over real text that ships with the
      repo: "rewrite this paragraph with one change", paragraphs of docs/*.md. Output tokens per
      second over the whole set, and the acceptance rate.
load: ordinary questions (no copying) at concurrency 1, 4, 16, 64 and 256, output tokens per
      second: with the dynamic policy on, speculation must never be slower.
Each side runs REPEATS times, alternating; tables give medians and every run.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from aioworker.bench.report import format_table
from aioworker.core.sampling_params import SamplingParams

REPEATS = 3
NUM_PARAGRAPHS = 6
CONCURRENCY = (1, 4, 16, 64, 256)
LOAD_TOKENS = 64
QUESTIONS = (
    "What is a paged KV cache, in two sentences?",
    "Name three ways to make a language model answer faster.",
    "Why do servers batch requests together?",
    "Explain what a heartbeat is in a distributed system.",
    "Write a haiku about a busy graphics card.",
    "What should an operator watch when a queue grows?",
    "Give two reasons a request might time out.",
    "How does a load balancer choose a server?",
)
DOCS = Path(__file__).resolve().parents[2] / "docs"


@dataclass
class Side:
    """One side's runs: output tokens per second of each."""

    rates: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def paragraphs(count: int = NUM_PARAGRAPHS) -> list[str]:
    """Prose paragraphs of the docs (no tables, lists or code), longest first."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        for block in path.read_text().split("\n\n"):
            text = " ".join(block.split())
            if 400 <= len(text) <= 1200 and not re.match(r"[#|`\-*0-9]", text):
                found.append(text)
    if len(found) < count:
        raise RuntimeError(f"found {len(found)} prose paragraphs under {DOCS}; need {count}")
    return sorted(found, key=len, reverse=True)[:count]


def copy_prompts(engine) -> list[list[int]]:
    prompts = []
    for text in paragraphs():
        word = max(re.findall(r"[a-z]{6,}", text), key=len)
        ask = (
            f"Rewrite the following paragraph exactly as it is, except that the word "
            f'"{word}" becomes "{word.upper()}".\n\n{text}'
        )
        prompts.append(engine.tokenizer.encode_chat([{"role": "user", "content": ask}]))
    return prompts


def question_prompts(engine, count: int) -> list[list[int]]:
    return [
        engine.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        for i in range(count)
    ]


def one_at_a_time(engine, prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=320)
    started, outputs = time.perf_counter(), []
    for prompt in prompts:
        [completion] = engine.generate([prompt], params)
        outputs.append(completion.token_ids)
    return sum(map(len, outputs)) / (time.perf_counter() - started), outputs


def concurrent(engine, prompts: list[list[int]]) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=LOAD_TOKENS, ignore_eos=True)
    started = time.perf_counter()
    completions = engine.generate(prompts, params)
    return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - started)


def alternate(engine, measure) -> dict[bool, Side]:
    """Both sides, REPEATS times each in alternating order (off first on odd repeats)."""
    speculator = engine.scheduler.speculator
    sides = {False: Side(), True: Side()}
    for repeat in range(REPEATS):
        for on in (False, True) if repeat % 2 == 0 else (True, False):
            engine.scheduler.speculator = speculator if on else None
            sides[on].rates.append(measure())
    engine.scheduler.speculator = speculator
    return sides


def run(engine) -> dict:
    """The copy task and the load; the engine must have speculation configured."""
    policy = engine.scheduler.speculator.policy
    prompts = copy_prompts(engine)
    one_at_a_time(engine, prompts[:1])  # warm-up: kernels, and the policy's first costs
    before = (policy.num_proposed, policy.num_accepted, policy.num_verified)
    outputs: dict[bool, list[list[int]]] = {}

    def copy_task() -> float:
        rate, tokens = one_at_a_time(engine, prompts)
        outputs[engine.scheduler.speculator is not None] = tokens
        return rate

    copy = alternate(engine, copy_task)
    proposed, accepted, verified = (
        now - then
        for now, then in zip(
            (policy.num_proposed, policy.num_accepted, policy.num_verified), before, strict=True
        )
    )
    load = {}
    for concurrency in CONCURRENCY:
        batch = question_prompts(engine, concurrency)
        concurrent(engine, batch[: min(concurrency, 4)])  # warm-up at this size
        load[concurrency] = alternate(engine, lambda batch=batch: concurrent(engine, batch))
    return {
        "copy": copy,
        "same_tokens": outputs[True] == outputs[False],
        "num_copy_tokens": sum(map(len, outputs[True])),
        "acceptance": accepted / proposed if proposed else 0.0,
        "accepted_length": 1 + accepted / verified if verified else 0.0,
        "load": load,
        "policy": policy.table(CONCURRENCY),
        "host_gap_ms": policy.host_gap_s * 1e3,
    }


def tables(result: dict, options) -> tuple[list[str], str]:
    """The comparison and the policy's table, and the notes under them."""

    def runs(side) -> str:
        return ", ".join(f"{rate:.1f}" for rate in side.rates)

    copy = result["copy"]
    copy_row = [
        "copy task, batch 1",
        f"{copy[False].median:.1f} ({runs(copy[False])})",
        f"{copy[True].median:.1f} ({runs(copy[True])})",
        f"{copy[True].median / copy[False].median:.2f}x",
        f"{100 * result['acceptance']:.0f}%, {result['accepted_length']:.2f}",
    ]
    header = ["output tok/s", "off (runs)", "on (runs)", "on / off", "accepted, tokens/verify"]
    rows = [copy_row]
    for concurrency, sides in result["load"].items():
        rows.append(
            [
                f"questions, concurrency {concurrency}",
                f"{sides[False].median:.1f} ({runs(sides[False])})",
                f"{sides[True].median:.1f} ({runs(sides[True])})",
                f"{sides[True].median / sides[False].median:.2f}x",
                "",
            ]
        )
    policy_rows = [
        [
            str(row["batch"]),
            str(row["k"]),
            "-" if row["step_ms"] is None else f"{row['step_ms']:.1f}",
            f"{row['gain']:.2f}",
        ]
        for row in result["policy"]
    ]
    policy = format_table(
        ["decode batch", "k chosen", "step ms (measured)", "expected gain"], policy_rows
    )
    notes = (
        f"One engine, speculation switched on and off between runs; medians of "
        f"{len(copy[True].rates)} runs per side, alternating. Speculation: {options.method}, "
        f"k <= {options.num_tokens}, n-grams {options.ngram_min}-{options.ngram_max}, dynamic "
        f"{'on' if options.dynamic else 'off'}. Copy task: {result['num_copy_tokens']} greedy "
        f"tokens over {NUM_PARAGRAPHS} paragraphs of docs/*.md, one "
        f"request at a time; the same tokens on both sides: {result['same_tokens']}. Questions: "
        f"greedy, {LOAD_TOKENS} tokens each. The policy's table after the run (acceptance and proposal "
        f"rate as measured; host gap between lockstep steps "
        f"{result['host_gap_ms']:.2f} ms):"
    )
    return [format_table(header, rows), policy], notes
