"""Sizing the host KV tier from `cache.host_kv_bytes` and giving the runner its copier."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aioworker.compute.host_kv import HostKvCopies, kv_block_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostTierSize:
    num_slots: int = 0
    block_bytes: int = 0


def block_dim_of(shape_of: Callable[[int, int, int, int], tuple[int, ...]]) -> int:
    """Which dimension of a cache tensor counts blocks, for a backend's layout function."""
    return shape_of(2, 3, 5, 7).index(2)  # sizes told apart: num_blocks is the 2


def install_host_tier(runner, host_kv_bytes: int, block_dim: int) -> HostTierSize:
    """Give `runner` a host tier of `host_kv_bytes` (nothing where it is 0)."""
    if not host_kv_bytes:
        return HostTierSize()
    block_bytes = kv_block_bytes(runner.kv_layers(), block_dim)
    num_slots = host_kv_bytes // block_bytes
    if num_slots < 1:
        raise ValueError(
            f"cache.host_kv_bytes is {host_kv_bytes}, less than one KV block of this model "
            f"({block_bytes} bytes on this rank); give at least {block_bytes}, or 0 for no "
            "host tier"
        )
    runner.kv_copies = HostKvCopies(runner.kv_layers, num_slots, runner.device, block_dim)
    log.info(
        "host KV tier: %d blocks, %.2f GiB of %shost memory", num_slots,
        num_slots * block_bytes / 2**30, "pinned " if runner.device.type == "cuda" else "",
    )  # fmt: skip
    return HostTierSize(num_slots, block_bytes)
