"""W9, a multi-turn chat whose histories outgrow the device KV cache, served with the host KV
tier off and on from the same draws (`aioworker bench --workload w9`; the issue calls it W8, a
name the quantization workload, gpu_quant.py, already had).

Every user has a system prompt of its own; each turn's prompt is the previous prompt, the
previous answer and a new message. Users run at once in a closed loop: a user's next turn is
added when its answer ends. The device holds a fraction of the working set (every user's final
history), so without the tier each turn recomputes the history evicted since the last. Any scale
runs on the CPU too (tests/bench/test_gpu_host_tier.py); gpu_host_tier_run.py runs it on a GPU.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from aioworker.bench.gpu import random_prompt
from aioworker.core.outputs import RequestOutput
from aioworker.core.sampling_params import SamplingParams

# Counters of the tier's stats() (its sizes and occupancy are not: they are not per run).
TIER_COUNTERS = (
    "host_kv_hit_blocks",
    "host_kv_saved_blocks",
    "host_kv_swaps_out",
    "host_kv_swaps_in",
    "host_kv_copy_failures",
    "host_kv_bytes_saved",
    "host_kv_bytes_loaded",
    "host_kv_ms_saving",
    "host_kv_ms_loading",
)


@dataclass(frozen=True)
class ChatScale:
    """The issue's sizes by default; tests shrink them."""

    num_users: int = 128
    num_turns: int = 8
    system_tokens: int = 1500
    message_tokens: tuple[int, int] = (40, 60)  # a user message's length, uniform in this range
    new_tokens: int = 200
    device_share: float = 0.25  # device KV blocks / working-set blocks
    host_margin: float = 1.1  # host tier blocks / working-set blocks, at least
    vocab: int = 10000  # token ids are drawn below this
    seed: int = 9


@dataclass(frozen=True)
class Conversation:
    system: list[int]
    messages: list[list[int]]  # one per turn


def draw(scale: ChatScale) -> list[Conversation]:
    rng = random.Random(scale.seed)
    low, high = scale.message_tokens
    return [
        Conversation(
            random_prompt(scale.system_tokens, scale.vocab, rng),
            [
                random_prompt(rng.randint(low, high), scale.vocab, rng)
                for _ in range(scale.num_turns)
            ],
        )
        for _ in range(scale.num_users)
    ]


def final_history_tokens(conversation: Conversation, scale: ChatScale) -> int:
    """The system prompt, every message and every answer."""
    messages = sum(len(m) for m in conversation.messages)
    return len(conversation.system) + messages + scale.num_turns * scale.new_tokens


@dataclass(frozen=True)
class Sizing:
    block_size: int
    block_bytes: int  # one block's KV, every layer's K and V, from the model's config shape
    working_set_blocks: int  # the sum over users of their final history, in blocks
    num_device_blocks: int
    host_kv_bytes: int
    max_model_len: int

    def overrides(self, tier: bool) -> dict[str, int]:
        return {
            "cache.num_blocks": self.num_device_blocks,
            "cache.host_kv_bytes": self.host_kv_bytes if tier else 0,
            "model.max_model_len": self.max_model_len,
        }

    def describe(self) -> str:
        gib = self.block_bytes / 2**30
        return (
            f"working set {self.working_set_blocks:,} blocks of {self.block_size} tokens "
            f"({self.working_set_blocks * gib:.1f} GiB), "
            f"{self.working_set_blocks / self.num_device_blocks:.2f}x the device KV of "
            f"{self.num_device_blocks:,} blocks ({self.num_device_blocks * gib:.1f} GiB); host "
            f"tier {self.host_kv_bytes / 2**30:.1f} GiB "
            f"({self.host_kv_bytes // self.block_bytes:,} blocks of {self.block_bytes:,} bytes)"
        )


def size(
    conversations: list[Conversation], scale: ChatScale, block_size: int, block_bytes: int
) -> Sizing:
    """Device KV as `device_share` of the working set (never less than one history and a block),
    and a host tier holding the working set with `host_margin` to spare: a power of two of bytes,
    which torch's pinned-memory allocator rounds a request up to anyway."""
    blocks = [-(-final_history_tokens(c, scale) // block_size) for c in conversations]
    working_set = sum(blocks)
    num_device_blocks = max(math.ceil(working_set * scale.device_share), max(blocks) + 1)
    host_bytes = math.ceil(working_set * scale.host_margin) * block_bytes
    return Sizing(
        block_size,
        block_bytes,
        working_set,
        num_device_blocks,
        1 << (host_bytes - 1).bit_length(),
        max(blocks) * block_size,
    )


@dataclass
class ChatRun:
    seconds: float
    num_output_tokens: int
    ttft_s: list[list[float]]  # by user, by turn: from adding the request to its first token
    answers: list[list[list[int]]]  # by user, by turn
    tier_counts: dict[str, float]  # TIER_COUNTERS during the run (empty with no tier)
    num_preemptions: int
    kv_block_bytes: int  # the engine's own (0 with no tier)

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds

    @property
    def all_ttft_s(self) -> list[float]:
        return [t for turns in self.ttft_s for t in turns]

    @property
    def mean_ttft_s(self) -> float:
        return statistics.mean(self.all_ttft_s)

    @property
    def p99_ttft_s(self) -> float:
        return percentile(self.all_ttft_s, 0.99)

    def mean_ttft_by_turn(self) -> list[float]:
        return [statistics.mean(turn) for turn in zip(*self.ttft_s, strict=True)]


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: the smallest value at least `fraction` of the values do not exceed."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(fraction * len(ranked)) - 1)]


class ClosedLoop:
    """Each user's turns in order, the next added as soon as the previous answer ends."""

    def __init__(
        self, engine, conversations: list[Conversation], params: SamplingParams, every: int
    ) -> None:
        """`every`: call `on_progress` each time this many more turns have ended."""
        self.engine = engine
        self.conversations = conversations
        self.params = params
        self.prompts = [c.system + c.messages[0] for c in conversations]
        self.answers: list[list[list[int]]] = [[] for _ in conversations]
        self.ttft_s: list[list[float]] = [[] for _ in conversations]
        self.num_turns_ended = 0
        self.every = every
        self.on_progress: Callable[[int], None] = lambda num_ended: None
        self._user_of: dict[str, int] = {}
        self._added_at: dict[str, float] = {}
        self._replies: dict[str, list[int]] = {}

    def add(self, user: int) -> None:
        request_id = f"u{user}-t{len(self.answers[user])}"
        self._user_of[request_id] = user
        self._replies[request_id] = []
        self._added_at[request_id] = time.perf_counter()
        self.engine.add_request(self.prompts[user], self.params, request_id)

    def take(self, out: RequestOutput, now: float) -> None:
        reply = self._replies[out.request_id]
        if out.token_ids and not reply:
            user = self._user_of[out.request_id]
            self.ttft_s[user].append(now - self._added_at[out.request_id])
        reply += out.token_ids
        if out.finished:
            self._end(out, reply)

    def _end(self, out: RequestOutput, reply: list[int]) -> None:
        if out.error or len(reply) != self.params.max_tokens:
            raise RuntimeError(
                f"W9 request {out.request_id} ended ({out.finish_reason}) after {len(reply)} of "
                f"{self.params.max_tokens} tokens: {out.error or 'no error given'}"
            )
        user = self._user_of.pop(out.request_id)
        del self._replies[out.request_id], self._added_at[out.request_id]
        self.answers[user].append(reply)
        turn = len(self.answers[user])
        if turn < len(self.conversations[user].messages):
            self.prompts[user] = (
                self.prompts[user] + reply + self.conversations[user].messages[turn]
            )
            self.add(user)
        self.num_turns_ended += 1
        if self.num_turns_ended % self.every == 0:
            self.on_progress(self.num_turns_ended)


def chat(
    engine,
    conversations: list[Conversation],
    scale: ChatScale,
    report: Callable[[str], None] = lambda line: None,
    label: str = "",
) -> ChatRun:
    """Every user's conversation to its end, all at once; greedy answers of `new_tokens`."""
    _warm_up(engine, scale)
    before = _tier_counts(engine)
    num_preemptions = engine.scheduler.num_preemptions
    params = SamplingParams(temperature=0.0, max_tokens=scale.new_tokens, ignore_eos=True)
    total = scale.num_users * scale.num_turns
    loop = ClosedLoop(engine, conversations, params, max(1, total // 8))
    started = time.perf_counter()
    loop.on_progress = lambda num_ended: report(
        f"W9 {label}: {num_ended}/{total} turns, {time.perf_counter() - started:.1f} s"
    )
    for user in range(len(conversations)):
        loop.add(user)
    num_tokens = 0
    while engine.has_unfinished:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            num_tokens += len(out.token_ids)
            loop.take(out, now)
    seconds = time.perf_counter() - started
    after = _tier_counts(engine)
    return ChatRun(
        seconds,
        num_tokens,
        loop.ttft_s,
        loop.answers,
        {key: after[key] - before[key] for key in after},
        engine.scheduler.num_preemptions - num_preemptions,
        engine.loaded.kv_block_bytes,
    )


def _warm_up(engine, scale: ChatScale) -> None:
    """A short request of fresh tokens (kernels compile, copies start), then both tiers forget
    what it left."""
    prompt = random_prompt(scale.system_tokens, scale.vocab, random.Random(-scale.seed))
    engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.core.reset_prefix_cache()


def _tier_counts(engine) -> dict[str, float]:
    stats = engine.scheduler.connector.stats()
    return {key: stats[key] for key in TIER_COUNTERS if key in stats}


@dataclass
class BothWays:
    sizing: Sizing
    off: ChatRun
    on: ChatRun


def both_ways(
    make_engine: Callable[..., object],
    free: Callable[[object], None],
    scale: ChatScale,
    block_size: int,
    block_bytes: int,
    report: Callable[[str], None] = lambda line: None,
) -> BothWays:
    """The same draws with the host tier off, then on, each on an engine of its own (built by
    `make_engine(**overrides)`, freed by `free` before the next is built)."""
    conversations = draw(scale)
    sizing = size(conversations, scale, block_size, block_bytes)
    report(f"W9: {sizing.describe()}")
    runs = {}
    for tier in (False, True):
        name = f"tier {'on' if tier else 'off'}"
        report(f"W9 {name}: building the engine")
        engine = make_engine(**sizing.overrides(tier))
        try:
            runs[tier] = chat(engine, conversations, scale, report, name)
        finally:
            free(engine)
        report(f"W9 {name}: done in {runs[tier].seconds:.1f} s")
    return BothWays(sizing, runs[False], runs[True])
