"""`aioworker admin` against a fake-executor worker started as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from aioworker.cli.admin import format_status
from aioworker.cli.main import main
from aioworker.core.fake_executor import FAKE_WEIGHT_BYTES_HELD, FAKE_WEIGHT_BYTES_READ
from tests.cli_workers import (  # noqa: F401
    HEARTBEAT_INTERVAL_S,
    Worker,
    Workers,
    cli,
    wait_for_state,
)

STATUS_KEYS = {"group", "state", "step_id", "num_running", "num_waiting", "kv_blocks_used"}
STATUS_KEYS |= {"kv_blocks_total", "num_requests", "weights_version", "tensor_parallel_size"}
STATUS_KEYS |= {"weights_per_rank"}


def test_status_reports_ready_with_its_data(capsys, ready_worker: Worker) -> None:
    code, out, _ = cli(capsys, "admin", "status", *ready_worker.args)
    assert code == 0
    assert out.splitlines()[0] == "group 0"
    assert any(line.split() == ["state", "READY"] for line in out.splitlines())
    weights = "weights_per_rank rank 0: none, 120 MiB held, 96 MiB read/step"
    assert any(line.split() == weights.split() for line in out.splitlines())

    code, out, _ = cli(capsys, "admin", "status", "--json", *ready_worker.args)
    assert code == 0
    record = json.loads(out)
    assert record["ok"] is True and record["group"] == 0 and record["message"] == "READY"
    assert record["data"].keys() >= STATUS_KEYS
    assert record["data"]["kv_blocks_total"] == 65536  # the fake executor's default
    assert not [key for key in record["data"] if key.startswith("host_kv")]  # it has no tier
    assert record["data"]["weights_per_rank"] == [
        {
            "rank": 0,
            "quantization": "none",
            "weight_bytes_held": FAKE_WEIGHT_BYTES_HELD,
            "weight_bytes_read": FAKE_WEIGHT_BYTES_READ,
        }
    ]


def test_status_text_gives_each_rank_its_weights_line() -> None:
    rank = {"quantization": "wint4", "weight_bytes_held": 118 << 20, "weight_bytes_read": 1 << 19}
    data = {"state": "READY", "weights_per_rank": [{"rank": r, **rank} for r in (0, 1)]}
    assert format_status(0, data).splitlines() == [
        "group 0",
        "  state             READY",
        "  weights_per_rank  rank 0: wint4, 118 MiB held, 0.5 MiB read/step",
        "                    rank 1: wint4, 118 MiB held, 0.5 MiB read/step",
    ]
    loading = format_status(0, {"state": "LOADING", "weights_per_rank": []})
    assert loading.splitlines()[-1] == "  weights_per_rank  -"


def test_status_text_gives_each_rank_its_expert_load_line() -> None:
    rank = {
        "experts": "experts 4-7 of 8 (expert parallel)", "imbalance": 2.0, "steps": 12,
        "tokens_per_expert_per_step": {"min": 1.0, "mean": 1.5, "max": 3.0},
    }  # fmt: skip
    lines = format_status(0, {"expert_load_per_rank": [{"rank": 1, **rank}]}).splitlines()
    assert lines[1] == (
        "  expert_load_per_rank  rank 1: experts 4-7 of 8 (expert parallel); tokens per expert "
        "per step 1 / 1.5 / 3 (min / mean / max), imbalance x2.00, 12 steps"
    )


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
        (["wait-ready", "now"], "wait-ready takes no argument"),
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
    assert "\n  wait-ready " in out


# -- wait-ready -----------------------------------------------------------------------------------


def test_wait_ready_returns_0_on_a_ready_worker(capsys, ready_worker: Worker) -> None:
    code, out, err = cli(capsys, "admin", "wait-ready", *ready_worker.args)
    assert code == 0, err
    assert out == "group 0: READY\n"
    code, out, _ = cli(capsys, "admin", "wait-ready", "--json", *ready_worker.args)
    record = json.loads(out)
    assert code == 0 and record["ok"] is True and record["message"] == "READY"


def test_wait_ready_gives_up_with_3_when_nothing_runs(capsys, workers: Workers) -> None:
    started = time.monotonic()
    code, out, err = cli(
        capsys, "admin", "wait-ready", "--timeout", "0.5", *workers.deployment().args
    )
    assert code == 3 and time.monotonic() - started < 2.0
    assert out == ""
    assert "group 0 is not READY after 0.5s: unreachable: no reply from" in err


def test_wait_ready_gives_up_on_a_draining_worker(capsys, draining_worker: Worker) -> None:
    code, _, err = cli(capsys, "admin", "wait-ready", "--timeout", "0.5", *draining_worker.args)
    assert code == 3
    assert "group 0 is not READY after 0.5s: DRAINING" in err


def test_wait_ready_waits_for_a_loading_group(capsys, workers: Workers) -> None:
    # The driver of a TP=2 group beats LOADING until its peer starts.
    driver = workers.start(until="LOADING", extra={"parallel.tensor_parallel_size": 2})
    command = [sys.executable, "-m", "aioworker.cli.main", "admin", "wait-ready", *driver.args]
    waiting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert waiting.poll() is None  # still waiting
    peer = Worker(driver.overrides, log_path=driver.log_path.with_suffix(".r1.log"))
    with peer.log_path.open("w") as log:
        peer.process = subprocess.Popen(
            [*command[:3], "worker", "--rank", "1", "--fake-executor", *driver.args],
            stdout=log,
            stderr=log,
        )
    workers.started.append(peer)
    out, err = waiting.communicate(timeout=20)
    assert waiting.returncode == 0, err
    assert out == "group 0: READY\n"
