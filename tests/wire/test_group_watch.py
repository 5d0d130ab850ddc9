"""The client's watch over a group's driver heartbeat: a silent group is lost (its requests end),
a lost group that beats again is used again, and a group whose driver restarted before it was
missed ends what the old driver held."""

from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from aioworker.wire.group_watch import GroupWatch
from aioworker.wire.health import MISSING, STALE
from aioworker.wire.security import ClientSecurity
from tests.beats import beat_frames as beat


def watched(endpoint: str, first_beat_timeout_s: float):
    """A driver's PUB socket bound at `endpoint` and a watch over it that records losses."""
    context = zmq.asyncio.Context()
    driver = context.socket(zmq.PUB)
    driver.setsockopt(zmq.LINGER, 0)
    driver.bind(endpoint)
    lost: list[str] = []
    watch = GroupWatch(
        context, [endpoint], ClientSecurity(), first_beat_timeout_s, lambda g, why: lost.append(why)
    )
    return context, driver, watch, lost


def test_a_lost_group_that_beats_again_comes_back(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/beats"

    async def scenario() -> list:
        context, driver, watch, lost = watched(endpoint, 0.3)
        watcher = asyncio.ensure_future(watch.run())
        seen = []

        async def beat_until_seen(state: str) -> None:
            deadline = time.monotonic() + 5
            while watch.status(0) != state and time.monotonic() < deadline:
                await driver.send_multipart(beat(state))
                await asyncio.sleep(0.01)
                watch.refresh()

        try:
            for state in ("READY", None, "LOADING", "READY"):
                if state is None:  # silent for more than 3 intervals of 0.05 s
                    await asyncio.sleep(0.4)
                else:
                    await beat_until_seen(state)
                seen.append((watch.status(0), watch.is_lost[0]))
        finally:
            watcher.cancel()
            watch.close()
            driver.close()
            context.term()
        return seen, lost

    seen, lost = asyncio.run(scenario())
    assert seen == [("READY", False), (STALE, True), ("LOADING", False), ("READY", False)]
    assert len(lost) == 1 and lost[0].startswith("group 0 is lost: no heartbeat for")


def test_a_driver_that_restarts_before_it_is_missed_ends_what_the_old_one_held(tmp_path) -> None:
    """A supervisor can restart a crashed group within the three silent intervals that make it
    lost; requests sent to the dead process would then never be answered, nor counted out."""
    endpoint = f"ipc://{tmp_path}/beats"

    async def scenario() -> tuple[list, list[str]]:
        context, driver, watch, lost = watched(endpoint, 10.0)
        seen = []
        try:
            for pid in (100, 100, 200):
                deadline = time.monotonic() + 5
                while watch.driver_pids[0] != pid and time.monotonic() < deadline:
                    await driver.send_multipart(beat("READY", pid=pid))
                    await asyncio.sleep(0.01)
                    watch.refresh()
                seen.append((watch.status(0), list(lost)))
        finally:
            watch.close()
            driver.close()
            context.term()
        return seen, lost

    seen, lost = asyncio.run(scenario())
    assert seen[:2] == [("READY", []), ("READY", [])]
    assert seen[2] == ("READY", ["group 0 restarted (driver pid 200)"])


def test_a_loading_group_may_be_silent_longer_than_a_ready_one(tmp_path) -> None:
    """Silent for 5 intervals after its last beat: lost if that beat said READY, not if it said
    LOADING (10 intervals are allowed while a rank imports and reads its files)."""
    endpoint = f"ipc://{tmp_path}/beats"

    async def silent_after(state: str) -> tuple[bool, list[str]]:
        context, driver, watch, lost = watched(endpoint, 10.0)
        watcher = asyncio.ensure_future(watch.run())
        try:
            deadline = time.monotonic() + 5
            while watch.status(0) != state and time.monotonic() < deadline:
                await driver.send_multipart(beat(state, interval_s=0.1))
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            return watch.is_lost[0], lost
        finally:
            watcher.cancel()
            watch.close()
            driver.close()
            context.term()

    assert asyncio.run(silent_after("LOADING")) == (False, [])
    is_lost, lost = asyncio.run(silent_after("READY"))
    assert is_lost and lost == ["group 0 is lost: no heartbeat for 0.3s"]


def test_a_request_before_the_first_beat_waits_for_it_not_for_the_allowance(tmp_path) -> None:
    """An API server started beside its workers found the group MISSING for the moment its
    first beat took to arrive, and refused a request sent then (503)."""
    from aioworker.wire.client import Client

    async def first_beats_after(delay_s: float | None) -> tuple[float, list[str]]:
        context = zmq.asyncio.Context()
        driver = context.socket(zmq.PUB)
        driver.setsockopt(zmq.LINGER, 0)
        driver.bind(f"ipc://{tmp_path}/beats")
        client = Client([f"ipc://{tmp_path}/tasks"], f"ipc://{tmp_path}/replies",
                        heartbeat_endpoints=[f"ipc://{tmp_path}/beats"],
                        first_beat_timeout_s=2.0)  # fmt: skip
        await client.start()

        async def beat_later() -> None:
            await asyncio.sleep(delay_s)
            while True:
                await driver.send_multipart(beat("READY"))
                await asyncio.sleep(0.01)

        beating = asyncio.ensure_future(beat_later()) if delay_s is not None else None
        started = time.monotonic()
        try:
            await client.first_beats()
            return time.monotonic() - started, client.group_states()
        finally:
            if beating is not None:
                beating.cancel()
            await client.close()
            driver.close()
            context.term()

    waited, states = asyncio.run(first_beats_after(0.2))
    assert states == ["READY"] and 0.15 < waited < 1.8, waited
    waited, states = asyncio.run(first_beats_after(None))  # never beats: the allowance ends it
    assert states == [MISSING] and 1.9 < waited < 4.0, waited
