"""A rank's watch over its peers' heartbeats: a peer is lost after 3 silent intervals, or 10
while its last beat said it was loading, and the error says how long and in what state."""

from __future__ import annotations

import time

import pytest
import zmq

from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.liveness import SUBSCRIBE_ALL, LivenessWatch
from tests.beats import beat_frames

INTERVAL_S = 0.1


def beat(state: str) -> list[bytes]:
    return beat_frames(state, rank=1, pid=7, interval_s=INTERVAL_S)


@pytest.fixture
def heard(tmp_path):
    """heard(state): a watch over rank 1 that has read one beat of `state` from it."""
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.bind(f"ipc://{tmp_path}/beats")
    subs = []

    def watch_after(state: str) -> LivenessWatch:
        sub = context.socket(zmq.SUB)
        for option, value in SUBSCRIBE_ALL.items():
            sub.setsockopt(option, value)
        sub.connect(f"ipc://{tmp_path}/beats")
        subs.append(sub)
        watch = LivenessWatch(sub, {1}, interval_s=INTERVAL_S, first_beat_grace_s=60.0)
        for _ in range(100):  # until the subscription has reached the publisher
            pub.send_multipart(beat(state))
            time.sleep(0.01)
            watch.read_beats()
            if watch.states.get(1) == state:
                return watch
        raise AssertionError("no beat arrived")

    yield watch_after
    for sock in [pub, *subs]:
        sock.close(linger=0)
    context.term()


def test_a_ready_peer_silent_for_three_intervals_is_lost(heard) -> None:
    watch = heard("READY")
    watch.check(time.monotonic() + 2.5 * INTERVAL_S)
    with pytest.raises(FatalError, match=r"rank 1 sent no heartbeat for 0\.3s \(READY\)"):
        watch.check(time.monotonic() + 3.5 * INTERVAL_S)


def test_a_loading_peer_may_be_silent_for_ten_intervals(heard) -> None:
    """Importing torch kept a loading rank of a busy 2-core host silent for 0.95 s."""
    watch = heard("LOADING")
    watch.check(time.monotonic() + 9.5 * INTERVAL_S)
    with pytest.raises(FatalError, match=r"no heartbeat for 1\.0s \(LOADING\)"):
        watch.check(time.monotonic() + 10.5 * INTERVAL_S)


def test_a_peer_known_up_before_its_first_beat_is_lost_after_three_intervals(tmp_path) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        watch = LivenessWatch(sub, {1}, interval_s=INTERVAL_S, first_beat_grace_s=60.0)
        watch.check(time.monotonic() + 30.0)  # within the start-up grace
        watch.expect_beats_now(1)
        with pytest.raises(FatalError, match="before its first beat"):
            watch.check(time.monotonic() + 3.5 * INTERVAL_S)
    finally:
        sub.close(linger=0)
        context.term()
