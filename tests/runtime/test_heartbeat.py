"""A rank beats at once when its state changes, and an admin reply leaves only after a beat that
carries the state it reports: whoever reads the heartbeats (a client, a gateway) has seen the
state by the time an admin command prints it, however long the beat interval. Every rank's
beats, and its driver's status, say what each rank's weights amount to, and the driver's what
its host KV tier holds and has copied."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from aioworker.cli.admin import format_status, wait_ready
from aioworker.core.fake_executor import FAKE_WEIGHT_BYTES_HELD, FAKE_WEIGHT_BYTES_READ
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from aioworker.wire.protocol import HEARTBEAT_DECODER
from aioworker.wire.transport import group_endpoints
from tests.runtime.inprocess import InProcessGroup, inprocess_config, run

# Longer than any test here waits: a beat that arrives came from a state change or a reply.
SLOW_BEATS = {"runtime.heartbeat_interval_s": 30.0}


async def beats_so_far(sock: zmq.asyncio.Socket) -> list[str]:
    """The states of every beat that has arrived, without waiting for more."""
    states = []
    while await sock.poll(0):
        states.append(HEARTBEAT_DECODER.decode(await sock.recv_multipart()).state)
    return states


def test_every_admin_reply_follows_a_beat_of_the_state_it_reports(tmp_path) -> None:
    config = inprocess_config(tmp_path, **SLOW_BEATS)

    async def scenario(group: InProcessGroup, client: Client) -> list[tuple[str, list[str]]]:
        context = zmq.asyncio.Context.instance()
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(group_endpoints(config.runtime, 0, 1).heartbeats[0])
        try:
            while not await beats_so_far(sock):  # every status reply is preceded by a beat
                await group.admin("status")
                await asyncio.sleep(0.05)
            seen = []
            for command in ("pause", "status", "resume", "status"):
                reply = await group.admin(command)
                await sock.poll(50)  # the beat left first; give it the time to arrive
                seen.append((reply.message, await beats_so_far(sock)))
            return seen
        finally:
            sock.close()

    seen, _ = run(scenario, config)
    paused, status_paused, resumed, status_ready = seen
    assert paused[1][-1] == "PAUSED" and status_paused == ("PAUSED", ["PAUSED"])
    assert resumed[1][-1] == "READY" and status_ready == ("READY", ["READY"])


def test_right_after_wait_ready_a_client_sees_ready_every_time(tmp_path) -> None:
    """A group that starts and loads for a moment, three times over, watched by a client all
    along: once `admin wait-ready` returns, the client's own view (from heartbeats) already says
    READY, and a request runs."""
    config = inprocess_config(tmp_path, **SLOW_BEATS)

    async def main() -> list[tuple[list[str], str]]:
        seen = []
        async with Client.from_config(config) as client:
            for _ in range(3):
                group = InProcessGroup(config, load_seconds=0.3)
                try:
                    assert await asyncio.to_thread(wait_ready, config, [0], 10.0, False) == 0
                    states = client.group_states()
                    done = await client.generate([1, 2, 3], SamplingParams(max_tokens=2))
                    seen.append((states, done.finish_reason))
                finally:
                    await group.stop()
        return seen

    assert asyncio.run(main()) == [(["READY"], "length")] * 3


def test_each_rank_beats_its_own_weights_and_the_driver_reports_them_all(
    tmp_path, distinct_weights
) -> None:
    config = inprocess_config(
        tmp_path, **{"parallel.tensor_parallel_size": 2, "model.quantization": "wint4"}
    )

    async def scenario(group: InProcessGroup, client: Client):
        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in group_endpoints(config.runtime, 0, 2).heartbeats:
            sock.connect(endpoint)
        beats = {}
        try:
            while len(beats) < 2:
                beat = HEARTBEAT_DECODER.decode(await sock.recv_multipart())
                if beat.state == "READY":
                    beats[beat.rank] = beat
        finally:
            sock.close()
        return beats, (await group.admin("status")).data

    (beats, status), _ = run(scenario, config)
    for rank in (0, 1):
        beat = beats[rank]
        assert beat.quantization == "wint4"
        assert beat.weight_bytes_held == FAKE_WEIGHT_BYTES_HELD + (rank << 20)
        assert beat.weight_bytes_read == FAKE_WEIGHT_BYTES_READ
    assert status["weights_per_rank"] == [
        {
            "rank": rank,
            "quantization": "wint4",
            "weight_bytes_held": FAKE_WEIGHT_BYTES_HELD + (rank << 20),
            "weight_bytes_read": FAKE_WEIGHT_BYTES_READ,
        }
        for rank in (0, 1)
    ]
    lines = format_status(0, status).splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[0] == "weights_per_rank")
    assert lines[at].split(maxsplit=1)[1] == "rank 0: wint4, 120 MiB held, 96 MiB read/step"
    assert lines[at + 1].strip() == "rank 1: wint4, 121 MiB held, 96 MiB read/step"


def test_the_drivers_beats_and_status_carry_its_host_tier(tmp_path, host_tier) -> None:
    config = inprocess_config(tmp_path)

    async def scenario(group: InProcessGroup, client: Client):
        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(group_endpoints(config.runtime, 0, 1).heartbeats[0])
        try:
            while (beat := HEARTBEAT_DECODER.decode(await sock.recv_multipart())).state != "READY":
                pass
        finally:
            sock.close()
        return beat, (await group.admin("status")).data

    (beat, status), _ = run(scenario, config)
    assert {name: getattr(beat, name) for name in host_tier} == host_tier
    assert {name: status[name] for name in host_tier} == host_tier
    assert status["host_kv_blocks_free"] == 4096 - 120
    lines = [line.split() for line in format_status(0, status).splitlines()]
    assert ["host_kv_blocks_free", "3976"] in lines and ["host_kv_hit_blocks", "37"] in lines


def test_a_stop_that_finds_the_beat_thread_ended_closes_nothing_twice(
    tmp_path, monkeypatch
) -> None:
    """The race a drain met under load: the stop's wake-up ends the thread, which closes its
    socket and pipe, before `stop` looks whether it is alive."""
    from types import SimpleNamespace

    from aioworker.runtime import heartbeat

    monkeypatch.setattr(heartbeat, "encode", lambda beat: [b"beat"])
    source = SimpleNamespace(interval_s=0.05, make=lambda: None)
    context = zmq.Context()
    try:
        started = heartbeat.HeartbeatThread(source, context, f"ipc://{tmp_path}/a", None)
        started.start()
        started._stopping = True
        started._wake()
        started._thread.join(2)  # the thread has closed everything itself
        started.stop()  # closed the wake pipe a second time: OSError EBADF
        never_started = heartbeat.HeartbeatThread(source, context, f"ipc://{tmp_path}/b", None)
        never_started.stop()
        assert never_started._closed
    finally:
        context.term()


def test_a_beat_held_up_for_intervals_is_logged_and_one_on_time_is_not(
    tmp_path, monkeypatch, caplog
) -> None:
    """Operators learn that a rank was starved (the CPU, or the GIL held by an import) before
    its watchers give up on it."""
    import logging
    import time
    from types import SimpleNamespace

    from aioworker.runtime import heartbeat

    monkeypatch.setattr(heartbeat, "encode", lambda beat: [b"beat"])
    made: list[float] = []

    def make() -> None:
        made.append(time.monotonic())
        if len(made) == 3:
            time.sleep(1.0)  # five intervals: the thread waits on what holds it up

    source = SimpleNamespace(interval_s=0.2, make=make, lifecycle=SimpleNamespace(state="READY"))
    context = zmq.Context()
    try:
        with caplog.at_level(logging.WARNING, logger=heartbeat.__name__):
            beats = heartbeat.HeartbeatThread(source, context, f"ipc://{tmp_path}/beats", None)
            beats.start()
            while len(made) < 5:
                time.sleep(0.01)
            beats.stop()
    finally:
        context.term()
    late = [r.getMessage() for r in caplog.records if "heartbeat late" in r.getMessage()]
    held = [m for m in late if float(m.split("late: ")[1].split("s")[0]) >= 1.0]
    assert len(held) == 1 and "state READY" in held[0] and "interval 0.20s" in held[0], late
    # The beats on time are not logged (a busy machine may delay one past two intervals).
    assert len(late) <= 2, late
