"""`aioworker admin` against a fake-executor worker started as a subprocess."""

from __future__ import annotations

import json
import time

import pytest

from aioworker.cli.main import main
from tests.cli_workers import (  # noqa: F401
    HEARTBEAT_INTERVAL_S,
    Worker,
    Workers,
    cli,
    wait_for_state,
)

STATUS_KEYS = {"group", "state", "step_id", "num_running", "num_waiting", "kv_blocks_used"}
STATUS_KEYS |= {"kv_blocks_total", "num_requests", "weights_version", "tensor_parallel_size"}


def test_status_reports_ready_with_its_data(capsys, ready_worker: Worker) -> None:
    code, out, _ = cli(capsys, "admin", "status", *ready_worker.args)
    assert code == 0
    assert out.splitlines()[0] == "group 0"
    assert any(line.split() == ["state", "READY"] for line in out.splitlines())

    code, out, _ = cli(capsys, "admin", "status", "--json", *ready_worker.args)
    assert code == 0
    record = json.loads(out)
    assert record["ok"] is True and record["group"] == 0 and record["message"] == "READY"
    assert record["data"].keys() >= STATUS_KEYS
    assert record["data"]["kv_blocks_total"] == 65536  # the fake executor's default


def test_pause_and_resume_change_the_state(capsys, ready_worker: Worker) -> None:
    def state() -> str:
        _, out, _ = cli(capsys, "admin", "status", "--json", *ready_worker.args)
        return json.loads(out)["data"]["state"]

    code, out, _ = cli(capsys, "admin", "pause", *ready_worker.args)
    assert code == 0 and out.startswith("group 0: paused")
    assert state() == "PAUSED"
    assert cli(capsys, "admin", "resume", *ready_worker.args)[0] == 0
    assert state() == "READY"
    code, _, err = cli(capsys, "admin", "resume", *ready_worker.args)
    assert code == 1 and "cannot resume: worker is READY" in err


def test_abort_of_an_unknown_request_exits_1(capsys, ready_worker: Worker) -> None:
    code, out, err = cli(capsys, "admin", "abort", "no-such-id", *ready_worker.args)
    assert code == 1 and out == ""
    assert "group 0: no request 'no-such-id' in flight" in err


def test_set_log_level(capsys, ready_worker: Worker) -> None:
    code, out, _ = cli(capsys, "admin", "set-log-level", "debug", *ready_worker.args)
    assert code == 0 and "log level set to DEBUG" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set-log-level", "loud"], "log level 'loud' is not one of DEBUG, INFO"),
        (["set-log-level"], "set-log-level needs an argument; usage: set-log-level LEVEL"),
        (["abort"], "abort needs an argument; usage: abort REQUEST_ID"),
        (["status", "now"], "status takes no argument"),
        (["drain", "soon"], "drain deadline 'soon' is not a number of seconds"),
        (["status", "--group", "1"], "--group 1 is outside this deployment's groups 0..0"),
        (["status", "--timeout", "0"], "--timeout 0: give a positive number of seconds"),
    ],
)
def test_bad_arguments_exit_2_before_anything_is_sent(
    capsys, workers: Workers, argv: list[str], message: str
) -> None:
    # No worker serves this name: had anything been sent, the command would time out (exit 3).
    code, _, err = cli(capsys, "admin", *argv, *workers.deployment().args)
    assert code == 2 and message in err


def test_no_worker_times_out_with_exit_3_naming_the_endpoint(capsys, workers: Workers) -> None:
    absent = workers.deployment()
    endpoint = f"ipc://{workers.directory}/run/{absent.overrides['runtime.name']}-g0-admin"
    started = time.monotonic()
    code, out, err = cli(capsys, "admin", "status", "--timeout", "0.5", *absent.args)
    assert code == 3 and time.monotonic() - started < 2.0
    assert f"no reply from {endpoint} within 0.5s" in err and out == ""

    code, out, _ = cli(capsys, "admin", "status", "--timeout", "0.5", "--json", *absent.args)
    assert code == 3 and json.loads(out)["ok"] is False


def test_shutdown_stops_the_worker_cleanly(capsys, workers: Workers) -> None:
    worker = workers.start()
    code, out, _ = cli(capsys, "admin", "shutdown", *worker.args)
    assert code == 0 and out.startswith("group 0: shutting down; aborted 0 request(s)")
    assert worker.process.wait(timeout=10) == 0


def test_help_explains_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["admin", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for usage in ("status", "pause", "resume", "drain [DEADLINE_S]", "abort REQUEST_ID"):
        assert f"\n  {usage} " in out
    assert "\n  shutdown " in out and "\n  set-log-level LEVEL " in out
