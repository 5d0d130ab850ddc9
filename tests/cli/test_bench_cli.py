"""`aioworker bench` picks the runner of a workload that runs alone, and refuses two of them
together, naming the fix."""

from __future__ import annotations

import pytest

from aioworker.cli import bench_alone
from aioworker.cli.main import main


@pytest.mark.parametrize("workload", sorted(bench_alone.RUNS))
def test_a_workload_alone_reaches_its_runner(workload: str, monkeypatch) -> None:
    called = []
    monkeypatch.setitem(bench_alone.RUNS, workload, lambda args: called.append(args) or 7)
    assert main(["bench", "--workload", workload, "--record", "out.md"]) == 7
    [args] = called
    assert args.workload == [workload] and args.record == "out.md"


def test_two_workloads_that_run_alone_are_refused(monkeypatch, capsys) -> None:
    for name in bench_alone.RUNS:
        monkeypatch.setitem(bench_alone.RUNS, name, lambda args: pytest.fail("ran"))
    assert main(["bench", "--workload", "chat", "--workload", "spec"]) == 2
    assert "on its own" in capsys.readouterr().err
