"""GroupControl drains a group without owning its open requests: it counts them and may end
them all; the driver's OpenRequests tells it when an abort leaves none open."""

from __future__ import annotations

import asyncio

from aioworker.core.outputs import RequestOutput
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.lifecycle import RankLifecycle
from aioworker.runtime.notify import SystemdNotifier
from aioworker.runtime.open_requests import OpenRequests
from aioworker.wire.health import RankState


class Core:
    """The engine core as OpenRequests uses it."""

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        pass

    def abort(self, request_id: str) -> bool:
        return True

    def terminal_output(self, request_id, reason, error=None, error_kind=None, sample_index=0):
        return RequestOutput(request_id, [], reason, error, error_kind=error_kind)


class Results:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, reply_to: str, message, client_key) -> None:
        self.sent.append(message)


def serving_lifecycle() -> RankLifecycle:
    lifecycle = RankLifecycle(0, 0, SystemdNotifier({}))
    lifecycle.move(RankState.LOADING)
    lifecycle.move(RankState.READY)
    return lifecycle


def test_the_last_abort_ends_a_drain_through_the_driver_s_hook() -> None:
    async def scenario() -> tuple[RankLifecycle, Results, GroupControl]:
        lifecycle, results = serving_lifecycle(), Results()
        requests = OpenRequests(Core(), results, group=0)
        control = GroupControl(lifecycle, Core(), requests)
        requests.on_all_ended = control.finish_drain_if_done
        for request_id in ("a", "b"):
            requests.admit(request_id, [1, 2], SamplingParams(), ("ipc://inbox", None))
        assert control.start_drain(60.0) == "draining"
        requests.abort("a", "by an operator")
        assert lifecycle.state is RankState.DRAINING  # "b" still runs
        requests.abort("b", "by an operator")
        control.close()
        return lifecycle, results, control

    lifecycle, results, control = asyncio.run(scenario())
    assert lifecycle.state is RankState.STOPPED and lifecycle.stopped.is_set()
    assert [m.outputs[0].finish_reason for m in results.sent] == ["abort", "abort"]
    assert not hasattr(control, "requests")  # the driver owns them, not GroupControl


class Counted:
    """All a drain needs of the open requests: a count and a way to end them all."""

    def __init__(self, num_open: int) -> None:
        self.num_open = num_open
        self.reasons: list[str] = []

    def __len__(self) -> int:
        return self.num_open

    def abort_all(self, reason: str) -> int:
        self.reasons.append(reason)
        count, self.num_open = self.num_open, 0
        return count


def test_a_drain_deadline_ends_what_still_runs_and_stops() -> None:
    async def scenario() -> tuple[RankLifecycle, Counted]:
        lifecycle, counted = serving_lifecycle(), Counted(3)
        control = GroupControl(lifecycle, Core(), counted)
        control.start_drain(0.05)
        await asyncio.wait_for(lifecycle.stopped.wait(), 5)
        return lifecycle, counted

    lifecycle, counted = asyncio.run(scenario())
    assert counted.reasons == ["drain deadline of 0.05s reached"]
    assert lifecycle.state is RankState.STOPPED
