"""Admin frames cannot kill a rank: a bad drain deadline is refused by the server, and whatever
a handler raises becomes a refusal with the reason."""

from __future__ import annotations

import pytest

from aioworker.config import WorkerConfig
from aioworker.runtime.admin import AdminHandler
from aioworker.wire.health import RankState
from tests.runtime.inprocess import run


@pytest.mark.parametrize("deadline", ["nan", "-1", "inf", "1e400", "soon"])
def test_a_bad_drain_deadline_is_refused_and_the_rank_serves_on(
    inproc_config: WorkerConfig, deadline: str
) -> None:
    async def scenario(group, client):
        reply = await group.admin("drain", deadline, check=False)
        return reply, group.rank.lifecycle.state

    (reply, state), group = run(scenario, inproc_config)
    assert (
        not reply.ok and f"drain deadline {deadline!r} is not a number of seconds" in reply.message
    )
    assert state is RankState.READY
    assert group.task.result() == 0  # stopped cleanly by the harness, not failed


def test_a_handler_that_raises_answers_with_the_reason(
    inproc_config: WorkerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self, argument: str):
        raise RuntimeError("boom")

    monkeypatch.setattr(AdminHandler, "pause", broken)

    async def scenario(group, client):
        failed = await group.admin("pause", check=False)
        status = await group.admin("status")
        return failed, status

    (failed, status), group = run(scenario, inproc_config)
    assert not failed.ok and failed.message == "pause failed: RuntimeError: boom"
    assert status.data["state"] == "READY"
    assert group.task.result() == 0
