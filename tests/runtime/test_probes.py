"""A hostile operator's probes against a live group under load: whatever happens, every request
ends with exactly one terminal output, and no KV block stays in use afterwards."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import zmq

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from aioworker.wire.protocol import VERSION_FRAME, AbortRequest, encode
from aioworker.wire.transport import group_endpoints
from tests.workers import admin, deployment, running

LOAD = SamplingParams(max_tokens=60, ignore_eos=True)
SLOW_STEPS = ("--fake-executor", "--fake-step-ms", "5")
# The 50 streams of a client that is about to be killed.
DOOMED_CLIENT = """
import asyncio, sys
from aioworker.config import load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client

async def main():
    client = Client.from_config(load_config(overrides=eval(sys.argv[1])))
    streams = [await client.submit([1, 2], SamplingParams(max_tokens=100000)) for _ in range(50)]
    for stream in streams:
        await stream.__anext__()
    print("streaming", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def run_load(config, probe: Callable[[], None], num_requests: int = 40):
    """Stream `num_requests` requests while `probe()` runs on a thread; every stream's outputs
    and the client's count of outputs for requests that had already ended."""

    async def scenario():
        async with Client.from_config(config) as client:
            streams = [await client.submit([3, 4, 5], LOAD) for _ in range(num_requests)]
            consumers = [asyncio.ensure_future(_collect(stream)) for stream in streams]
            await asyncio.to_thread(probe)
            outputs = await asyncio.wait_for(asyncio.gather(*consumers), 60)
            await asyncio.sleep(0.3)  # a second terminal would arrive by now
            return outputs, client.num_unexpected_outputs

    return asyncio.run(scenario())


async def _collect(stream) -> list:
    return [out async for out in stream]


def assert_one_terminal_each(outputs: list[list]) -> None:
    for outs in outputs:
        assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished


def assert_nothing_held(config) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = admin(config, "status").data
        if status["num_requests"] == 0 and status["kv_blocks_used"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"still held after the probe: {status}")


def test_bad_frames_on_every_socket_and_1000_unknown_aborts() -> None:
    config, set_args = deployment(**{"parallel.tensor_parallel_size": 2})
    endpoints = group_endpoints(config.runtime, 0, 2)

    with running(config, set_args, *SLOW_STEPS):

        def probe() -> None:
            context = zmq.Context()
            garbage = [[b"\xff" * 9], [VERSION_FRAME, b"\xc1 not msgpack"], [b"\x07", b"x" * 100]]
            targets = [
                (zmq.PUSH, endpoints.tasks),
                (zmq.DEALER, endpoints.admin),
                (zmq.PUSH, endpoints.acks),
                (zmq.XSUB, endpoints.control),
                *((zmq.XSUB, beats) for beats in endpoints.heartbeats),  # the peer's too
            ]
            for kind, endpoint in targets:
                with context.socket(kind) as sock:
                    sock.setsockopt(zmq.LINGER, 1000)
                    sock.connect(endpoint)
                    for frames in garbage:
                        sock.send_multipart(frames)
            with context.socket(zmq.PUSH) as tasks:
                tasks.setsockopt(zmq.LINGER, 5000)
                tasks.connect(endpoints.tasks)
                for i in range(1000):
                    tasks.send_multipart(encode(AbortRequest(request_id=f"unknown-{i}")))
            context.term()

        outputs, unexpected = run_load(config, probe)
        assert_one_terminal_each(outputs)
        assert unexpected == 0
        assert all(outs[-1].finish_reason == "length" for outs in outputs)
        assert_nothing_held(config)


def test_bad_frames_into_a_clients_result_socket_touch_no_stream() -> None:
    config, set_args = deployment()
    with running(config, set_args, *SLOW_STEPS):

        async def scenario():
            async with Client.from_config(config) as client:
                streams = [await client.submit([3, 4, 5], LOAD) for _ in range(10)]
                context = zmq.Context()
                with context.socket(zmq.PUSH) as rogue:
                    rogue.setsockopt(zmq.LINGER, 1000)
                    rogue.connect(client.reply_endpoint)
                    for frames in ([b"\x00"], [VERSION_FRAME, b"\xc1"], [VERSION_FRAME, b"\x90"]):
                        rogue.send_multipart(frames)
                context.term()
                return await asyncio.gather(*(_collect(s) for s in streams))

        outputs = asyncio.run(scenario())
    assert_one_terminal_each(outputs)
    assert all(outs[-1].finish_reason == "length" for outs in outputs)


def test_a_client_killed_with_50_streams_costs_nothing_after_a_moment() -> None:
    config, set_args = deployment()
    overrides = {"runtime.name": config.runtime.name, "runtime.heartbeat_interval_s": 0.2}
    with running(config, set_args, *SLOW_STEPS):
        doomed = subprocess.Popen(
            [sys.executable, "-c", DOOMED_CLIENT, repr(overrides)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert doomed.stdout.readline().strip() == "streaming"
        assert admin(config, "status").data["num_requests"] == 50
        doomed.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.wait()
        assert_nothing_held(config)
        freed_after = time.monotonic() - killed_at
        print(f"50 streams of a killed client freed {freed_after:.2f} s after the kill")
    assert freed_after < 3.0  # probed a second into the stall, then aborted


def test_sigterm_during_update_weights_drains_after_it() -> None:
    config, set_args = deployment(**{"parallel.tensor_parallel_size": 2})
    with running(config, set_args, *SLOW_STEPS, "--fake-phase-ms", "300") as (driver, peer):
        replies = []

        def probe() -> None:
            update = threading.Thread(
                target=lambda: replies.append(
                    admin(config, "update-weights", "/w", mode="keep", timeout=30)
                )
            )
            update.start()
            time.sleep(0.1)  # the update holds the group now
            driver.send_signal(signal.SIGTERM)
            update.join()

        outputs, unexpected = run_load(config, probe)
        codes = (driver.wait(20), peer.wait(20))
    assert_one_terminal_each(outputs)
    assert all(outs[-1].finish_reason == "length" for outs in outputs) and unexpected == 0
    assert replies[0].ok, replies[0].message
    assert codes == (0, 0)


def test_a_driver_frozen_for_10_s_ends_its_streams_and_frees_everything_on_waking() -> None:
    config, set_args = deployment()
    with running(config, set_args, *SLOW_STEPS) as (driver,):

        def probe() -> None:
            time.sleep(0.1)
            driver.send_signal(signal.SIGSTOP)
            time.sleep(10)
            driver.send_signal(signal.SIGCONT)

        outputs, _ = run_load(config, probe)
        assert_one_terminal_each(outputs)  # the client ended them: the group was silent
        assert all(outs[-1].finish_reason == "error" for outs in outputs)
        assert_nothing_held(config)  # the client's aborts reached it when it woke
