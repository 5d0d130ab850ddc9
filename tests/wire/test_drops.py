"""Nothing is dropped silently: malformed heartbeats and messages that could not be sent are
counted, and logged at most once a second."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import zmq

from aioworker.runtime.liveness import SUBSCRIBE_ALL, LivenessWatch
from aioworker.runtime.peer_group import PeerGroup
from aioworker.wire.drops import DropCounter
from aioworker.wire.protocol import VERSION_FRAME


def test_a_flood_of_drops_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    counter = DropCounter(logging.getLogger("t"), "frames", interval_s=60)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            counter.count(f"bad {i}")
    assert counter.total == 1000
    assert len(caplog.records) == 1 and "bad 0" in caplog.records[0].getMessage()


def test_malformed_heartbeats_are_counted_by_the_liveness_watch(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/beats"
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.bind(endpoint)
    sub = context.socket(zmq.SUB)
    for option, value in SUBSCRIBE_ALL.items():
        sub.setsockopt(option, value)
    sub.connect(endpoint)
    watch = LivenessWatch(sub, {1}, interval_s=1.0, first_beat_grace_s=60.0)
    try:
        for _ in range(20):  # until the subscription has reached the publisher
            pub.send_multipart([VERSION_FRAME, b"not a heartbeat"])
            time.sleep(0.02)
            watch.read_beats()
            if watch.malformed.total:
                break
        assert watch.malformed.total >= 1
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
        context.term()


def test_a_shutdown_the_peers_cannot_get_is_counted() -> None:
    class Closed:
        async def send_multipart(self, frames, flags=0):
            raise zmq.ZMQError(zmq.ENOTSOCK)

    group = PeerGroup.__new__(PeerGroup)
    group.control = Closed()
    group.unsent = DropCounter(logging.getLogger("t"), "messages")
    asyncio.run(group.send_shutdown("stopping", failed=False))
    assert group.unsent.total == 1
