"""The Prometheus gauges a group's state gives, in one table: each rank serves them from its own
state (runtime/metrics.py) and the gateway from the group driver's latest heartbeat
(api/engine_metrics.py). Both carry the same field names, so one reader serves both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _kv_usage(state: Any) -> float:
    return state.kv_blocks_used / state.kv_blocks_total if state.kv_blocks_total else 0.0


def _field(name: str) -> Callable[[Any], float]:
    return lambda state: float(getattr(state, name))


def _seconds(ms_name: str) -> Callable[[Any], float]:
    return lambda state: getattr(state, ms_name) / 1e3


_HOST_KV = "Host KV tier (0 without one): "


# name, help, how to read it from a Heartbeat or a rank's ServingInfo.
STATE_GAUGES: tuple[tuple[str, str, Callable[[Any], float]], ...] = (
    ("aioworker:num_requests_running", "Requests being computed.", _field("num_running")),
    ("aioworker:num_requests_waiting", "Requests queued for admission.", _field("num_waiting")),
    ("aioworker:kv_cache_usage_perc", "Fraction of KV blocks in use (0 to 1).", _kv_usage),
    (
        "aioworker:prefix_cache_blocks",
        "KV blocks holding a cached prefix, in use or free.",
        _field("kv_blocks_cached"),
    ),
    (
        "aioworker:prefix_cache_hit_tokens",
        "Prompt tokens found computed in the prefix cache, since the group started.",
        _field("prefix_hit_tokens"),
    ),
    (
        "aioworker:prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache, since the group started.",
        _field("prefix_queried_tokens"),
    ),
    (
        "aioworker:spec_decode_num_draft_tokens",
        "Draft tokens verified by speculative decoding, since the group started.",
        _field("spec_draft_tokens"),
    ),
    (
        "aioworker:spec_decode_num_accepted_tokens",
        "Draft tokens accepted, since the group started.",
        _field("spec_accepted_tokens"),
    ),
    (
        "aioworker:spec_decode_num_verified",
        "Sequences verified (one per sequence per step with drafts), since the group started.",
        _field("spec_verified"),
    ),
    (
        "aioworker:host_kv_blocks_total",
        _HOST_KV + "its blocks.",
        _field("host_kv_blocks_total"),
    ),
    (
        "aioworker:host_kv_blocks_used",
        _HOST_KV + "blocks in use: cached prefixes, swapped-out sequences, copies in flight.",
        _field("host_kv_blocks_used"),
    ),
    (
        "aioworker:host_kv_blocks_cached",
        _HOST_KV + "blocks holding a cached prefix.",
        _field("host_kv_blocks_cached"),
    ),
    (
        "aioworker:host_kv_hit_blocks",
        _HOST_KV + "prefix blocks loaded back to the device, since the group started.",
        _field("host_kv_hit_blocks"),
    ),
    (
        "aioworker:host_kv_saved_blocks",
        _HOST_KV + "prefix blocks copied to it, since the group started.",
        _field("host_kv_saved_blocks"),
    ),
    (
        "aioworker:host_kv_swaps_out",
        _HOST_KV + "preempted sequences swapped out to it, since the group started.",
        _field("host_kv_swaps_out"),
    ),
    (
        "aioworker:host_kv_swaps_in",
        _HOST_KV + "swapped-out sequences loaded back, since the group started.",
        _field("host_kv_swaps_in"),
    ),
    (
        "aioworker:host_kv_copy_failures",
        _HOST_KV + "copies that failed either way, since the group started.",
        _field("host_kv_copy_failures"),
    ),
    (
        "aioworker:host_kv_bytes_saved",
        _HOST_KV + "bytes copied device to host (the driver's shard), since the group started.",
        _field("host_kv_bytes_saved"),
    ),
    (
        "aioworker:host_kv_bytes_loaded",
        _HOST_KV + "bytes copied host to device (the driver's shard), since the group started.",
        _field("host_kv_bytes_loaded"),
    ),
    (
        "aioworker:host_kv_save_seconds",
        _HOST_KV + "seconds of device-to-host copies, since the group started.",
        _seconds("host_kv_ms_saving"),
    ),
    (
        "aioworker:host_kv_load_seconds",
        _HOST_KV + "seconds of host-to-device copies, since the group started.",
        _seconds("host_kv_ms_loading"),
    ),
)
