"""Which group the client sends a request to, from the states its groups' heartbeats publish:
READY groups first, then groups that queue requests, then any group that beats (its refusal says
why), and a lost group only when nothing else is left."""

from __future__ import annotations

import pytest

from aioworker.wire.client import Client
from aioworker.wire.health import MISSING, STALE, takes_requests


class Watch:
    """What the client reads of GroupWatch."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.is_lost = [state == STALE or state == "FAILED" for state in states]

    def refresh(self) -> None:
        pass

    def status(self, group: int) -> str:
        return self.states[group]


def client_seeing(states: list[str], while_released: str = "queue") -> Client:
    endpoints = [f"ipc:///nowhere/g{g}-tasks" for g in range(len(states))]
    client = Client(endpoints, "ipc:///nowhere/inbox", while_released=while_released)
    client._watch, client._started = Watch(states), True
    return client


def picks(client: Client, num_requests: int = 8) -> set[int]:
    return {client._pick_group() for _ in range(num_requests)}


@pytest.mark.parametrize(
    "states, expected",
    [
        (["PAUSED", "READY", "LOADING"], {1}),
        (["UPDATING_WEIGHTS", "LOADING", STALE], {0}),
        (["LOADING", "PAUSED", "WEIGHTS_CLEARED"], {1, 2}),
        ([STALE, "DRAINING", MISSING], {1}),  # the rank's own refusal will say it drains
        (["STOPPED", MISSING], {0, 1}),  # nothing beats: any, and a lost one ends at once
    ],
)
def test_ready_groups_first_then_queuing_ones(states: list[str], expected: set[int]) -> None:
    assert picks(client_seeing(states)) == expected


def test_a_ready_group_wins_even_with_more_requests_in_flight() -> None:
    client = client_seeing(["PAUSED", "READY"])
    client._in_flight = [0, 50]
    assert picks(client) == {1}


def test_memory_released_queues_only_under_while_released_queue() -> None:
    assert picks(client_seeing(["WEIGHTS_CLEARED", "LOADING"], "queue")) == {0}
    assert picks(client_seeing(["WEIGHTS_CLEARED", "LOADING"], "reject")) == {0, 1}


@pytest.mark.parametrize(
    "state, takes",
    [
        ("READY", True),
        ("PAUSED", True),
        ("UPDATING_WEIGHTS", True),
        ("WEIGHTS_CLEARED", True),
        ("STARTING", False),
        ("LOADING", False),
        ("WARMING", False),
        ("DRAINING", False),
        ("STOPPED", False),
        ("FAILED", False),
        (MISSING, False),
        (STALE, False),
    ],
)
def test_which_states_take_requests(state: str, takes: bool) -> None:
    assert takes_requests(state) is takes
    assert takes_requests(state, "reject") is (takes and state != "WEIGHTS_CLEARED")


def test_a_request_that_cannot_be_encoded_is_refused_before_it_is_registered() -> None:
    import asyncio

    from aioworker.core.sampling_params import InvalidRequestError, SamplingParams

    client = client_seeing(["READY"])
    with pytest.raises(InvalidRequestError, match="64 bits"):
        asyncio.run(client.submit([2**64], SamplingParams(max_tokens=1)))
    assert client.num_in_flight == 0 and client._in_flight == [0]
