import itertools

from aioworker.wire.health import MISSING, RankState
from aioworker.wire.routing import pick_group


def picks(states, lost, in_flight, count=4, queues=("PAUSED",)) -> list[int]:
    turns = itertools.cycle(range(len(states)))
    return [
        pick_group(states, lost, in_flight, lambda s: s in (RankState.READY, *queues), turns)
        for _ in range(count)
    ]


def test_ready_groups_with_the_fewest_in_flight_win_in_turn() -> None:
    ready = [RankState.READY] * 3
    assert picks(ready, [False] * 3, [2, 1, 1]) == [1, 2, 1, 2]
    assert picks([RankState.READY, "PAUSED", RankState.READY], [False] * 3, [0, 0, 5]) == [0] * 4


def test_queuing_then_beating_then_any_group_when_none_is_ready() -> None:
    assert picks(["PAUSED", "DRAINING"], [False, False], [3, 0]) == [0] * 4
    assert picks(["DRAINING", MISSING], [False, False], [3, 0]) == [0] * 4
    assert picks([MISSING, MISSING], [True, False], [1, 0]) == [1] * 4
