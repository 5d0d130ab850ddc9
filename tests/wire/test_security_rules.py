"""The rules of a tcp deployment: no open ports reachable from other machines without keys,
key directories writable by their owner alone, a recording readable by its owner alone."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from aioworker.cli import keys as keys_cli
from aioworker.config import load_config
from aioworker.runtime.recorder import Recorder
from aioworker.wire.security import SecurityError, ServerSecurity
from tests.wire.curve import tcp_config


def test_tcp_on_an_outside_address_without_keys_is_refused() -> None:
    config = load_config(overrides={"runtime.transport": "tcp", "runtime.host": "10.1.2.3"})
    with pytest.raises(SecurityError, match="security.allow_insecure = true"):
        ServerSecurity.from_config(config)


def test_allow_insecure_starts_open_but_says_so_loudly(caplog: pytest.LogCaptureFixture) -> None:
    settings = {"runtime.transport": "tcp", "runtime.host": "10.1.2.3"}
    config = load_config(overrides={**settings, "security.allow_insecure": True})
    with caplog.at_level(logging.WARNING):
        assert not ServerSecurity.from_config(config).is_enabled
    assert "INSECURE" in caplog.text


def test_tcp_on_loopback_without_keys_is_allowed() -> None:
    config = load_config(overrides={"runtime.transport": "tcp", "runtime.host": "127.0.0.1"})
    assert not ServerSecurity.from_config(config).is_enabled


def test_a_worker_refuses_to_start_insecure_with_exit_2() -> None:
    command = [sys.executable, "-m", "aioworker.cli.main", "worker", "--rank", "0"]
    command += ["--fake-executor", "--set", "runtime.transport=tcp"]
    command += ["--set", "runtime.host=10.1.2.3"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "allow_insecure" in done.stderr


@pytest.mark.parametrize("which", ["authorized_clients_dir", "admin_clients_dir"])
def test_a_key_directory_others_may_write_is_refused(
    key_files: keys_cli.KeyFiles, which: str
) -> None:
    directory = getattr(key_files, which)
    os.chmod(directory, 0o777)
    with pytest.raises(SecurityError, match=f"chmod 700 {directory}"):
        ServerSecurity.from_config(tcp_config(key_files))


def test_a_recording_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "record.bin"
    path.write_bytes(b"")
    os.chmod(path, 0o644)  # an older file, world-readable
    Recorder(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = tmp_path / "fresh.bin"
    Recorder(fresh).close()
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
