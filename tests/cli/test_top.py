"""`aioworker top`: the heartbeat table and health rules on hand-made beats, then live against
fake-executor workers started as subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import msgspec

from aioworker.cli.top import beat_json
from aioworker.wire.health import (
    COLUMNS,
    HOST_KV_COLUMN,
    MISSING,
    STALE,
    BeatTable,
    Seen,
    expected_ranks,
    format_table,
    is_ready_state,
    not_ready_reason,
    rank_status,
    table_row,
    unhealthy_reason,
)
from aioworker.wire.protocol import Heartbeat
from tests.cli_workers import HEARTBEAT_INTERVAL_S, Worker, Workers, cli

NOW = 1000.0


def make_beat(group: int = 0, rank: int = 0, state: str = "READY", **fields) -> Heartbeat:
    values = dict(
        pid=42, step_id=7, step_elapsed_s=0.25, num_running=3, num_waiting=1, kv_blocks_used=10,
        kv_blocks_total=100, tokens_per_s=123.45, weights_version=2, interval_s=1.0, sent_at=0.0,
        kv_blocks_cached=6, prefix_hit_tokens=30, prefix_queried_tokens=120, quantization="wint4",
        weight_bytes_held=118 << 20, weight_bytes_read=96 << 20,
    )  # fmt: skip
    return Heartbeat(group=group, rank=rank, state=state, **{**values, **fields})


def seen(age_s: float, state: str = "READY", **fields) -> Seen:
    return Seen(make_beat(state=state, **fields), received_at=NOW - age_s)


# -- pure logic -----------------------------------------------------------------------------------


def test_status_is_missing_stale_or_the_beat_state() -> None:
    assert rank_status(None, NOW) == MISSING
    assert rank_status(seen(2.9), NOW) == "READY"
    assert rank_status(seen(3.1), NOW) == STALE
    # Staleness is measured in the rank's own intervals.
    assert rank_status(seen(3.1, interval_s=2.0), NOW) == "READY"
    # A rank in a final state stops beating on purpose: it keeps showing its state.
    assert rank_status(seen(60.0, state="STOPPED"), NOW) == "STOPPED"


def test_a_loading_rank_is_allowed_ten_intervals_of_silence() -> None:
    """Loading, warming and new weights hold the GIL in long calls (importing torch, reading a
    tokenizer, compiling kernels): a rank that said so is STALE after 10 intervals, not 3."""
    for state in ("STARTING", "LOADING", "PROFILING", "WARMING", "UPDATING_WEIGHTS"):
        assert rank_status(seen(9.9, state=state), NOW) == state
        assert rank_status(seen(10.1, state=state), NOW) == STALE
    for state in ("READY", "PAUSED", "DRAINING", "WEIGHTS_CLEARED"):
        assert rank_status(seen(3.1, state=state), NOW) == STALE
    assert rank_status(seen(60.0, state="FAILED"), NOW) == "FAILED"


def test_unhealthy_reasons() -> None:
    assert unhealthy_reason(seen(0.5), NOW) is None
    assert unhealthy_reason(seen(0.5, state="LOADING"), NOW) is None
    assert unhealthy_reason(None, NOW) == "MISSING: no heartbeat received"
    assert unhealthy_reason(seen(4.0), NOW) == "STALE: last heartbeat 4.0s ago; it beats every 1s"
    assert unhealthy_reason(seen(0.5, state="STOPPED"), NOW) == "STOPPED"
    failed = seen(0.5, state="FAILED", detail="step 3 failed: boom")
    assert unhealthy_reason(failed, NOW) == "FAILED: step 3 failed: boom"


def test_only_ready_is_ready_and_every_live_state_passes_liveness() -> None:
    assert is_ready_state("READY")
    assert not_ready_reason(seen(0.5), NOW) is None
    for state in ("STARTING", "LOADING", "WARMING", "PAUSED", "DRAINING", "UPDATING_WEIGHTS"):
        assert not is_ready_state(state)
        assert unhealthy_reason(seen(0.5, state=state), NOW) is None, state
        assert not_ready_reason(seen(0.5, state=state), NOW) == state
    # A rank that is not alive is not ready either, for the same reason.
    assert not_ready_reason(None, NOW) == "MISSING: no heartbeat received"
    assert not_ready_reason(seen(4.0), NOW) == unhealthy_reason(seen(4.0), NOW)
    failed = seen(0.5, state="FAILED", detail="boom")
    assert not_ready_reason(failed, NOW) == "FAILED: boom"


def test_beat_table_is_ready_when_every_rank_is_ready() -> None:
    table = BeatTable(expected_ranks(tp_size=2, dp_size=1))
    table.record(make_beat(0, 0, state="LOADING"), received_at=NOW)
    table.record(make_beat(0, 1), received_at=NOW)
    assert table.is_healthy(NOW) and not table.is_ready(NOW)
    assert table.not_ready(NOW) == {(0, 0): "LOADING"}
    table.record(make_beat(0, 0), received_at=NOW)
    assert table.is_ready(NOW)


def test_table_row_shows_every_field() -> None:
    row = table_row((1, 2), seen(0.5), NOW)
    assert row == (
        "1.2", "READY", "7", "0.25", "3", "1", "10/100", "6", "25.0", "123.5", "-", "-", "2",
        "wint4", "118/96", "-", "-", "42", "0.5", "",
    )  # fmt: skip


def test_an_moe_ranks_row_shows_its_experts_and_their_imbalance() -> None:
    # Experts 4-7; 2 steps through 3 MoE layers: 6, 6, 6, 18 tokens -> 1, 1, 1, 3 per step
    # per layer; the busiest over the mean (1.5) is 2.
    beat = msgspec.structs.replace(
        seen(0.5).beat, expert_layout="experts 4-7 of 8 (expert parallel)", expert_first=4,
        expert_tokens=[6, 6, 6, 18], expert_steps=2, expert_layers=3,
    )  # fmt: skip
    row = table_row((0, 1), Seen(beat, NOW - 0.5), NOW)
    assert row[COLUMNS.index("EXPERTS")] == "4-7 x2.00"
    assert len(row) == len(COLUMNS)
    speculating = seen(0.5, spec_draft_tokens=40, spec_accepted_tokens=30, spec_verified=10)
    assert table_row((1, 2), speculating, NOW)[10:12] == ("75.0", "4.00")
    # A tiny model in tenths of a MiB; a rank still loading has no weights to show.
    tiny = seen(0.5, quantization="none", weight_bytes_held=3 << 19, weight_bytes_read=1 << 19)
    assert table_row((1, 2), tiny, NOW)[13:15] == ("none", "1.5/0.5")
    loading = seen(0.5, state="LOADING", quantization="", weight_bytes_held=0, weight_bytes_read=0)
    assert table_row((1, 2), loading, NOW)[13:15] == ("-", "-")
    assert table_row((0, 1), None, NOW) == ("0.1", MISSING) + ("-",) * (len(COLUMNS) - 2)


HOST_TIER = dict(host_kv_blocks_total=4096, host_kv_blocks_used=120, host_kv_hit_blocks=37)


def test_a_host_tier_gets_its_column_and_only_then() -> None:
    table = BeatTable(expected_ranks(tp_size=2, dp_size=1))
    table.record(make_beat(0, 0), received_at=NOW)
    table.record(make_beat(0, 1), received_at=NOW)
    assert HOST_KV_COLUMN not in table.render(NOW).splitlines()[0].split()
    # The driver carries the group's tier; its peer shows none.
    table.record(make_beat(0, 0, **HOST_TIER), received_at=NOW)
    header, driver, peer = table.render(NOW).splitlines()
    at = header.index(HOST_KV_COLUMN)
    assert driver[at:].startswith("120/4096 37hit  ") and peer[at:].startswith("-  ")


def test_format_table_aligns_columns() -> None:
    rows = [table_row((0, 0), seen(0.5), NOW), table_row((0, 1), None, NOW)]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert lines[1].split()[:2] == ["0.0", "READY"] and lines[2].split()[:2] == ["0.1", MISSING]
    # Every column starts at the same offset on every line.
    assert lines[0].index("STEP ") == lines[1].index("7 ") == lines[2].index("- ")


def test_beat_table_tracks_the_expected_ranks() -> None:
    table = BeatTable(expected_ranks(tp_size=2, dp_size=2))
    assert table.keys() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for key in table.keys()[:3]:
        table.record(make_beat(*key), received_at=NOW)
    assert not table.has_all_beaten()
    assert table.unhealthy(NOW) == {(1, 1): "MISSING: no heartbeat received"}
    table.record(make_beat(1, 1), received_at=NOW)
    assert table.has_all_beaten() and table.is_healthy(NOW + 1.0)
    assert set(table.unhealthy(NOW + 3.5)) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert [row[1] for row in table.rows(NOW)] == ["READY"] * 4


def test_beat_json_adds_the_receive_time() -> None:
    record = json.loads(beat_json(make_beat(), received_at=5.5))
    assert record["type"] == "heartbeat" and record["state"] == "READY"
    assert record["received_at"] == 5.5 and record["sent_at"] == 0.0


# -- against running workers ----------------------------------------------------------------------


def top(*argv: str, timeout_s: float) -> str:
    """Run `aioworker top ARGV` as a subprocess for timeout_s; what it printed by then."""
    command = [sys.executable, "-m", "aioworker.cli.main", "top", *argv]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s).stdout
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"").decode()


def test_once_shows_the_rank_ready(capsys, ready_worker: Worker) -> None:
    code, out, _ = cli(capsys, "top", "--once", *ready_worker.args)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [name for name in COLUMNS if name != HOST_KV_COLUMN]  # no tier
    assert row.split()[:2] == ["0.0", "READY"]
    # The fake executor's weights: model.quantization as configured, 120 MiB held, 96 read.
    assert row.split()[13:15] == ["none", "120/96"]


def test_json_streams_parseable_beats(ready_worker: Worker) -> None:
    out = top("--json", *ready_worker.args, timeout_s=1.5)
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) >= 2
    assert {(r["group"], r["rank"], r["state"]) for r in records} == {(0, 0, "READY")}
    assert all(r["interval_s"] == HEARTBEAT_INTERVAL_S and r["received_at"] > 0 for r in records)


def test_check_passes_while_the_worker_runs(capsys, ready_worker: Worker) -> None:
    started = time.monotonic()
    code, out, err = cli(capsys, "top", "--check", *ready_worker.args)
    assert code == 0, err
    assert out == "healthy: all 1 rank(s) beating\n"
    assert time.monotonic() - started < 1.0  # it stops waiting once every rank has beaten


def test_a_killed_rank_turns_stale_and_fails_the_check(capsys, workers: Workers) -> None:
    worker = workers.start()
    assert cli(capsys, "top", "--check", *worker.args)[0] == 0
    command = [sys.executable, "-m", "aioworker.cli.main", "top", "--interval", "0.2"]
    live = subprocess.Popen([*command, *worker.args], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.8)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        # 3 intervals of 0.2s to turn STALE, then one redraw.
        time.sleep(3 * HEARTBEAT_INTERVAL_S + 0.6)
    finally:
        live.terminate()
    # Each table: a title line, the header, then the row of rank 0.0.
    states = [
        table.splitlines()[2].split()[1] for table in live.communicate()[0].split("\n\n")[:-1]
    ]
    assert "READY" in states and states[-1] == STALE

    code, out, err = cli(capsys, "top", "--check", "--wait", "0.6", *worker.args)
    assert code == 1 and out == ""
    assert "rank 0.0 is unhealthy: MISSING: no heartbeat received" in err


def test_check_names_the_missing_peer_of_a_tp2_group(capsys, loading_worker: Worker) -> None:
    # Rank 0 of a TP=2 group waits for its peer (never started) and beats LOADING meanwhile.
    code, _, err = cli(capsys, "top", "--check", "--wait", "0.6", *loading_worker.args)
    assert code == 1
    assert "rank 0.1 is unhealthy: MISSING: no heartbeat received" in err
    assert "rank 0.0" not in err  # LOADING is alive
    assert "1 of 2 rank(s) unhealthy" in err


def test_check_ready_names_the_loading_rank(capsys, loading_worker: Worker) -> None:
    code, out, err = cli(capsys, "top", "--check", "--ready", "--wait", "0.6", *loading_worker.args)
    assert code == 1 and out == ""
    assert "rank 0.0 is not ready: LOADING" in err
    assert "rank 0.1 is not ready: MISSING: no heartbeat received" in err
    assert "2 of 2 rank(s) not ready" in err


def test_check_ready_passes_on_a_ready_worker(capsys, ready_worker: Worker) -> None:
    started = time.monotonic()
    code, out, err = cli(capsys, "top", "--check", "--ready", *ready_worker.args)
    assert code == 0, err
    assert out == "ready: all 1 rank(s) READY\n"
    assert time.monotonic() - started < 1.0  # it stops waiting once every rank is READY


def test_a_draining_rank_is_alive_but_not_ready(capsys, draining_worker: Worker) -> None:
    code, out, err = cli(capsys, "top", "--check", *draining_worker.args)
    assert code == 0, err
    code, out, err = cli(
        capsys, "top", "--check", "--ready", "--wait", "0.6", *draining_worker.args
    )
    assert code == 1 and "rank 0.0 is not ready: DRAINING" in err


def test_ready_without_check_is_a_usage_error(capsys, workers: Workers) -> None:
    code, _, err = cli(capsys, "top", "--ready", *workers.deployment().args)
    assert code == 2 and "--ready goes with --check" in err
