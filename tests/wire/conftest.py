"""Fixtures of the CURVE tests: a deployment's key set, and another deployment's."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioworker.cli import keys as keys_cli


@pytest.fixture
def key_files(tmp_path: Path) -> keys_cli.KeyFiles:
    return keys_cli.write_keys(tmp_path / "keys", "client")


@pytest.fixture
def intruder_files(tmp_path: Path) -> keys_cli.KeyFiles:
    """A complete key set of another deployment: its client is not authorized for ours."""
    return keys_cli.write_keys(tmp_path / "other", "client")
