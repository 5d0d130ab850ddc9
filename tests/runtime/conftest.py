"""Fixtures of the runtime tests."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from aioworker.config import WorkerConfig
from aioworker.core.fake_executor import build_fake
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
