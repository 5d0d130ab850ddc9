"""Start-up refusals: each exits with its documented code and one line naming the cause, never
a traceback."""

from __future__ import annotations

import os
from pathlib import Path

from aioworker.runtime.state import ExitCode
from tests.workers import admin, deployment, read_log, running, start_worker


def test_a_second_instance_exits_1_with_one_line() -> None:
    config, set_args = deployment()
    with running(config, set_args, "--fake-executor"):
        second = start_worker(0, set_args, "--fake-executor")
        code = second.wait(10)
        assert admin(config, "status").data["state"] == "READY"  # the first one still serves
    log = read_log(second)
    assert code == ExitCode.FAILED
    assert "already served by another process" in log
    assert "Traceback" not in log and "AttributeError" not in log


def test_an_unsafe_runtime_directory_is_a_config_error(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir()
    os.chmod(runtime_dir, 0o777)
    _, set_args = deployment(**{"runtime.runtime_dir": str(runtime_dir)})
    worker = start_worker(0, set_args, "--fake-executor")
    code = worker.wait(30)
    log = read_log(worker)
    assert code == ExitCode.USAGE  # 2: systemd's RestartPreventExitStatus=2 stops retrying
    assert "must be owned by uid" in log and "mode 0700" in log
    assert "Traceback" not in log
