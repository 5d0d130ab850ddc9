"""A rank's health as seen from outside: the states it publishes, when its silence makes it
STALE, and the latest heartbeat of every rank with what it says (a status, a table row, whether
a liveness probe counts it unhealthy, whether a readiness probe counts it ready). Pure logic, no
sockets, no torch."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from aioworker.core.expert_load import ExpertLoad, imbalance, tokens_per_step
from aioworker.wire.protocol import Heartbeat


class RankState(enum.StrEnum):
    """Published in every heartbeat and in `admin status`; runtime/state.py says which state may
    follow which."""

    STARTING = "STARTING"
    LOADING = "LOADING"
    PROFILING = "PROFILING"
    WARMING = "WARMING"
    READY = "READY"
    PAUSED = "PAUSED"
    DRAINING = "DRAINING"
    UPDATING_WEIGHTS = "UPDATING_WEIGHTS"
    WEIGHTS_CLEARED = "WEIGHTS_CLEARED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


# A rank in a final state beats once more and then stops: monitors show its state, never STALE,
# and a probe fails on it as on MISSING and STALE.
FINAL_STATES = frozenset({RankState.STOPPED, RankState.FAILED})
# A rank whose last beat is older than this many of its own intervals is lost (killed, frozen or
# cut off): STALE to monitors, and fatal to the other ranks of its group.
STALE_AFTER_INTERVALS = 3
# ... or this many, while its last beat said it was loading, warming or taking new weights.
# Those phases import torch, read tokenizers and compile kernels in calls that hold the GIL, so
# the beat thread waits: on a busy 2-core host, importing torch kept a rank silent for 0.95 s,
# more than 3 intervals of 0.3 s, and its peer took it for dead.
LOADING_STALE_AFTER_INTERVALS = 10
LOADING_STATES = frozenset(
    {
        RankState.STARTING,
        RankState.LOADING,
        RankState.PROFILING,
        RankState.WARMING,
        RankState.UPDATING_WEIGHTS,
    }
)
MISSING = "MISSING"
STALE = "STALE"

COLUMNS = (
    "RANK", "STATE", "STEP", "STEP_S", "RUN", "WAIT", "KV_BLOCKS", "CACHED", "HIT%", "TOK/S",
    "ACC%", "ACC_LEN", "WEIGHTS", "QUANT", "WEIGHT_MIB", "EXPERTS", "HOST_KV", "PID",
    "AGE_S", "DETAIL",
)  # fmt: skip
# Shown only when some rank has what it shows: most deployments have no host tier.
HOST_KV_COLUMN = "HOST_KV"

RankKey = tuple[int, int]  # (group, rank inside the group)


@dataclass(frozen=True, slots=True)
class Seen:
    beat: Heartbeat
    # time.monotonic() when the beat arrived here.
    received_at: float


def expected_ranks(tp_size: int, dp_size: int) -> list[RankKey]:
    return [(group, rank) for group in range(dp_size) for rank in range(tp_size)]


def rank_label(key: RankKey) -> str:
    return f"{key[0]}.{key[1]}"


def rank_status(seen: Seen | None, now: float) -> str:
    """The beat's state, or MISSING (never beaten) or STALE (silent for too long)."""
    if seen is None:
        return MISSING
    state = seen.beat.state
    if state not in FINAL_STATES and is_stale(seen, now):
        return STALE
    return state


def stale_after_s(beat: Heartbeat) -> float:
    """How long after this beat its rank is lost if no other comes."""
    loading = beat.state in LOADING_STATES
    return (LOADING_STALE_AFTER_INTERVALS if loading else STALE_AFTER_INTERVALS) * beat.interval_s


def is_stale(seen: Seen, now: float) -> bool:
    return now - seen.received_at > stale_after_s(seen.beat)


def unhealthy_reason(seen: Seen | None, now: float) -> str | None:
    """Why a liveness probe should fail on this rank, or None if it is alive. A rank that is
    starting (LOADING, ...), paused or draining is alive: restarting it would not help."""
    status = rank_status(seen, now)
    if status == MISSING:
        return "MISSING: no heartbeat received"
    assert seen is not None
    age = now - seen.received_at
    if status == STALE:
        interval = seen.beat.interval_s
        return f"STALE: last heartbeat {age:.1f}s ago; it beats every {interval:g}s"
    if status in FINAL_STATES:
        detail = f": {seen.beat.detail}" if seen.beat.detail else ""
        return f"{status}{detail}"
    return None


def is_ready_state(state: str) -> bool:
    """The readiness rule: only a READY rank admits requests and runs their steps. Every other
    state refuses (starting, draining, stopped), queues (paused, weights) or ends them."""
    return state == RankState.READY


# States whose group takes a new request and holds it until they end: paused, and weights or
# memory operations (WEIGHTS_CLEARED only under runtime.while_released = "queue").
QUEUING_STATES = frozenset(
    {RankState.PAUSED, RankState.UPDATING_WEIGHTS, RankState.WEIGHTS_CLEARED}
)


def takes_requests(state: str, while_released: str = "queue") -> bool:
    """Whether a group in `state` takes a new request: READY runs it, a queuing state holds it.
    Every other state (starting, draining, stopped, failed; MISSING, STALE) refuses it."""
    if state == RankState.WEIGHTS_CLEARED:
        return while_released == "queue"
    return state == RankState.READY or state in QUEUING_STATES


def not_ready_reason(seen: Seen | None, now: float) -> str | None:
    """Why a readiness probe should fail on this rank (not alive, or alive but not READY), or
    None if it serves."""
    unhealthy = unhealthy_reason(seen, now)
    if unhealthy is not None:
        return unhealthy
    assert seen is not None
    if is_ready_state(seen.beat.state):
        return None
    return seen.beat.state + (f": {seen.beat.detail}" if seen.beat.detail else "")


def table_row(key: RankKey, seen: Seen | None, now: float) -> tuple[str, ...]:
    status = rank_status(seen, now)
    if seen is None:
        return (rank_label(key), status) + ("-",) * (len(COLUMNS) - 2)
    beat = seen.beat
    return (
        rank_label(key),
        status,
        str(beat.step_id),
        f"{beat.step_elapsed_s:.2f}",
        str(beat.num_running),
        str(beat.num_waiting),
        f"{beat.kv_blocks_used}/{beat.kv_blocks_total}",
        str(beat.kv_blocks_cached),
        f"{100 * beat.prefix_hit_rate:.1f}",
        f"{beat.tokens_per_s:.1f}",
        f"{100 * beat.spec_acceptance_rate:.1f}" if beat.spec_draft_tokens else "-",
        f"{beat.spec_mean_accepted_length:.2f}" if beat.spec_verified else "-",
        str(beat.weights_version),
        beat.quantization or "-",
        weight_mib(beat),
        experts_cell(beat),
        host_kv_cell(beat),
        str(beat.pid),
        f"{now - seen.received_at:.1f}",
        beat.detail,
    )


def weight_mib(beat: Heartbeat) -> str:
    """MiB of weights held / read per decode step; '-' before the rank has loaded."""
    if not beat.weight_bytes_held:
        return "-"
    return f"{format_mib(beat.weight_bytes_held)}/{format_mib(beat.weight_bytes_read)}"


def beat_expert_load(beat: Heartbeat) -> ExpertLoad:
    """The expert load a rank's beat carries (empty for a dense model)."""
    return ExpertLoad(
        beat.expert_layout, beat.expert_first, tuple(beat.expert_tokens), beat.expert_steps,
        beat.expert_layers,
    )  # fmt: skip


def experts_cell(beat: Heartbeat) -> str:
    """MoE models: the rank's experts and its busiest one's load over the mean since it
    started ('0-63 x1.31'); '-' for a dense model."""
    if not beat.expert_tokens:
        return "-"
    load = beat_expert_load(beat)
    last = beat.expert_first + len(beat.expert_tokens) - 1
    return f"{beat.expert_first}-{last} x{imbalance(tokens_per_step(load)):.2f}"


def host_kv_cell(beat: Heartbeat) -> str:
    """The host KV tier: blocks used/total and prefix blocks loaded back since the rank started
    ('120/4096 37hit'); '-' without a tier, and on a driver's peers (its beat has the group's)."""
    if not beat.host_kv_blocks_total:
        return "-"
    return f"{beat.host_kv_blocks_used}/{beat.host_kv_blocks_total} {beat.host_kv_hit_blocks}hit"


def format_mib(num_bytes: int) -> str:
    """Mebibytes: one decimal below 10 (a tiny model or draft), none from there."""
    mib = num_bytes / 2**20
    return f"{mib:.1f}" if mib < 10 else f"{mib:.0f}"


def describe_weights(quantization: str, bytes_held: int, bytes_read: int) -> str:
    """One rank's weights for people: 'wint4, 118 MiB held, 96 MiB read/step'."""
    return (
        f"{quantization}, {format_mib(bytes_held)} MiB held, {format_mib(bytes_read)} MiB read/step"
    )


def format_table(rows: list[tuple[str, ...]], hidden: frozenset[str] = frozenset()) -> str:
    """Left-aligned columns under the COLUMNS header, less the `hidden` ones; the last column
    (DETAIL) is not padded."""
    shown = [i for i, name in enumerate(COLUMNS) if name not in hidden]
    lines = [tuple(line[i] for i in shown) for line in [COLUMNS, *rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(shown) - 1)]
    return "\n".join(format_line(line, widths) for line in lines)


def hidden_columns(beats: list[Heartbeat]) -> frozenset[str]:
    """HOST_KV unless some rank beats a host tier."""
    has_host_tier = any(beat.host_kv_blocks_total for beat in beats)
    return frozenset() if has_host_tier else frozenset({HOST_KV_COLUMN})


def format_line(cells: tuple[str, ...], widths: list[int]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=True)]
    return "  ".join([*padded, cells[-1]]).rstrip()


class BeatTable:
    """The latest beat of every rank expected by the config (and of any other rank that beats)."""

    def __init__(self, expected: list[RankKey]) -> None:
        self.expected = expected
        self.latest: dict[RankKey, Seen] = {}

    def record(self, beat: Heartbeat, received_at: float) -> None:
        self.latest[(beat.group, beat.rank)] = Seen(beat, received_at)

    def has_all_beaten(self) -> bool:
        return self.latest.keys() >= set(self.expected)

    def keys(self) -> list[RankKey]:
        return sorted(set(self.expected) | set(self.latest))

    def rows(self, now: float) -> list[tuple[str, ...]]:
        return [table_row(key, self.latest.get(key), now) for key in self.keys()]

    def render(self, now: float) -> str:
        beats = [seen.beat for seen in self.latest.values()]
        return format_table(self.rows(now), hidden_columns(beats))

    def unhealthy(self, now: float) -> dict[RankKey, str]:
        """Rank -> why it is unhealthy, for every unhealthy rank (the liveness probe)."""
        return self._failing(unhealthy_reason, now)

    def is_healthy(self, now: float) -> bool:
        return not self.unhealthy(now)

    def not_ready(self, now: float) -> dict[RankKey, str]:
        """Rank -> why it is not ready, for every rank that is not READY (the readiness probe)."""
        return self._failing(not_ready_reason, now)

    def is_ready(self, now: float) -> bool:
        return not self.not_ready(now)

    def _failing(
        self, reason_of: Callable[[Seen | None, float], str | None], now: float
    ) -> dict[RankKey, str]:
        reasons = {key: reason_of(self.latest.get(key), now) for key in self.keys()}
        return {key: reason for key, reason in reasons.items() if reason is not None}
