"""Heavy frames against a tensor-parallel group: frames near the message bound are refused by
size without being decoded, one past it is cut off before it is read, and the driver keeps
beating, so its peer never takes it for dead and the group lives."""

from __future__ import annotations

import struct
import time

import msgspec
import pytest
import zmq

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.protocol import VERSION_FRAME
from aioworker.wire.transport import group_endpoints
from tests.runtime.test_reliability import submit_all
from tests.workers import admin, deployment, running

MB = 1 << 20


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def huge_submit(num_bytes: int, reply_to: str) -> bytes:
    """A well-formed submit whose prompt (token 0, one byte each) fills `num_bytes`: decoding it
    makes a Python list of that many ints."""
    head = msgspec.msgpack.encode(
        {"type": "submit", "request_id": "big", "params": {}, "reply_to": reply_to}
    )
    count = num_bytes - len(head) - 32
    prompt = b"\xdd" + struct.pack(">I", count) + bytes(count)  # msgpack array32 of 0s
    key = msgspec.msgpack.encode("prompt_token_ids")
    return bytes([head[0] + 1]) + head[1:] + key + prompt  # a fixmap one entry longer


def push_frames(endpoint: str, bodies: list[bytes]) -> None:
    context = zmq.Context()
    with context.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 5000)
        push.connect(endpoint)
        for body in bodies:
            push.send_multipart([VERSION_FRAME, body])
    context.term()


@pytest.mark.slow
def test_heavy_frames_leave_a_tensor_parallel_group_alive() -> None:
    config, set_args = deployment(**{"parallel.tensor_parallel_size": 2})
    tasks = group_endpoints(config.runtime, 0, 2).tasks
    with running(config, set_args, "--fake-executor") as (driver, peer):
        rss_before = peak_rss_bytes(driver.pid)
        reply_to = f"ipc://{config.runtime.runtime_dir or '/tmp'}/heavy-inbox"
        push_frames(tasks, [huge_submit(63 * MB, reply_to) for _ in range(3)])
        push_frames(tasks, [bytes(200 * MB)])
        time.sleep(8 * config.runtime.heartbeat_interval_s)  # 8 beats: a stall would show
        status = admin(config, "status").data
        rss_after = peak_rss_bytes(driver.pid)
        assert driver.poll() is None and peer.poll() is None
        assert status["state"] == "READY" and status["num_rejected_frames"] >= 3
        assert rss_after - rss_before < 400 * MB
        [outputs], _ = submit_all(config, 1, SamplingParams(max_tokens=3))
        assert outputs[-1].finish_reason == "length"
