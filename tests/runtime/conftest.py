"""Fixtures of the runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioworker.config import WorkerConfig
from tests.runtime.inprocess import inprocess_config


@pytest.fixture
def inproc_config(tmp_path: Path) -> WorkerConfig:
    """A deployment for a driver run in the test's own process (tests.runtime.inprocess)."""
    return inprocess_config(tmp_path)
