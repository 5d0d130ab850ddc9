"""Fixtures of the runtime tests."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from aioworker.config import WorkerConfig
from aioworker.core import engine_core
from aioworker.core.fake_executor import build_fake
from aioworker.core.kv_connector import NoKvConnector
from tests.runtime import inprocess
from tests.runtime.inprocess import inprocess_config


@pytest.fixture
def inproc_config(tmp_path: Path) -> WorkerConfig:
    """A deployment for a driver run in the test's own process (tests.runtime.inprocess)."""
    return inprocess_config(tmp_path)


@pytest.fixture
def distinct_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank of an in-process group reports weights of its own: the fake's, and its rank
    number in MiB more held (the driver's fake executor is built first, then its peers')."""
    ranks = itertools.count()

    def build(config: WorkerConfig, **faults):
        executor, loaded = build_fake(config, **faults)
        more = next(ranks) << 20
        return executor, dataclasses.replace(
            loaded, weight_bytes_held=loaded.weight_bytes_held + more
        )

    monkeypatch.setattr(inprocess, "build_fake", build)


# What a host tier's stats() says (every figure different, so each is checked where it lands).
HOST_TIER_STATS = {
    "host_kv_blocks_total": 4096, "host_kv_blocks_used": 120, "host_kv_blocks_cached": 100,
    "host_kv_hit_blocks": 37, "host_kv_saved_blocks": 250, "host_kv_swaps_out": 3,
    "host_kv_swaps_in": 2, "host_kv_copy_failures": 1, "host_kv_bytes_saved": 250 << 16,
    "host_kv_bytes_loaded": 37 << 16, "host_kv_ms_saving": 1500.0, "host_kv_ms_loading": 250.5,
}  # fmt: skip


class _HostTierFigures(NoKvConnector):
    """A host tier's figures without the tier: the fake executor copies nothing."""

    def stats(self) -> dict[str, int | float]:
        return dict(HOST_TIER_STATS)


@pytest.fixture
def host_tier(monkeypatch: pytest.MonkeyPatch) -> dict[str, int | float]:
    """Every engine core built gets a connector reporting HOST_TIER_STATS, which it returns."""
    monkeypatch.setattr(engine_core, "_connector", lambda loaded, preemption: _HostTierFigures())
    return HOST_TIER_STATS
