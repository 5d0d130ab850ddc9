"""Bad input never crashes a rank or leaks a KV block: property tests over every decoder, and
10,000 fuzzed frames across every socket of a running tensor-parallel group."""

from __future__ import annotations

import random
import time

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from aioworker.wire.protocol import (
    ACK_DECODER,
    ADMIN_DECODER,
    CONTROL_DECODER,
    HEARTBEAT_DECODER,
    RESULT_DECODER,
    TASK_DECODER,
    VERSION_FRAME,
    ProtocolError,
)
from aioworker.wire.transport import group_endpoints
from tests.workers import admin, deployment, running

DECODERS = [
    TASK_DECODER,
    RESULT_DECODER,
    CONTROL_DECODER,
    ACK_DECODER,
    ADMIN_DECODER,
    HEARTBEAT_DECODER,
]
TAGS = [
    "submit",
    "abort",
    "outputs",
    "rejected",
    "plan",
    "weights",
    "shutdown",
    "ready",
    "failed",
    "admin",
    "heartbeat",
    "nope",
]
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)


def decode_or_protocol_error(decoder, frames) -> None:
    try:
        decoder.decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_only_ever_raise_protocol_error(frames) -> None:
    for decoder in DECODERS:
        decode_or_protocol_error(decoder, frames)


@settings(max_examples=300, deadline=None)
@given(
    tag=st.sampled_from(TAGS),
    fields=st.dictionaries(st.text(max_size=16), values, max_size=8),
    version=st.integers(0, 3),
)
def test_wrong_tags_and_field_types_only_ever_raise_protocol_error(tag, fields, version) -> None:
    body = msgspec.msgpack.encode({**fields, "type": tag})
    for decoder in DECODERS:
        decode_or_protocol_error(decoder, [bytes([version]), body])


def fuzz_frame(rng: random.Random, reply_to: str, request_id: str) -> tuple[list[bytes], bool]:
    """A fuzzed task frame, and whether it is a well-formed submit (it must get one terminal)."""
    kind = rng.randrange(4)
    if kind == 0:
        return [rng.randbytes(rng.randrange(1, 80)) for _ in range(rng.randrange(1, 4))], False
    if kind == 1:
        return [bytes([rng.randrange(256)]), rng.randbytes(rng.randrange(0, 80))], False
    if kind == 2:
        body = {"type": rng.choice(TAGS), "request_id": rng.choice([request_id, 7, None]), "reply_to": reply_to,
                "prompt_token_ids": rng.choice([[1, 2], "x", [2**64 - 1], None]), "params": rng.choice([{}, [], {"max_tokens": "x"}])}  # fmt: skip
        return [VERSION_FRAME, msgspec.msgpack.encode(body)], False
    params = {
        "max_tokens": rng.randrange(-2, 8),
        "temperature": rng.choice([0.0, 0.7, -1.0, float("nan")]),
        "top_p": rng.choice([1.0, 0.5, 0.0, 1.5]),
        "top_k": rng.choice([0, 5, -3]),
    }
    prompt = [rng.randrange(0, 33000) for _ in range(rng.choice([0, 1, 5, 40, 70]))]
    body = {
        "type": "submit",
        "request_id": request_id,
        "prompt_token_ids": prompt,
        "params": params,
        "reply_to": reply_to,
    }
    return [VERSION_FRAME, msgspec.msgpack.encode(body)], True


# 100,000 frames measured for leaks, after 50,000 that let the allocator reach its high water.
WARM_UP_FRAMES = 50_000
NUM_FRAMES = WARM_UP_FRAMES + 100_000


def fuzz_sockets(context: zmq.Context, endpoints) -> dict[str, zmq.Socket]:
    """A socket of the matching kind on every endpoint of the group, the heartbeats included."""
    sockets = {}
    for name, kind, endpoint in (
        ("tasks", zmq.PUSH, endpoints.tasks),
        ("admin", zmq.DEALER, endpoints.admin),
        ("acks", zmq.PUSH, endpoints.acks),
        ("control", zmq.XSUB, endpoints.control),
        ("beats0", zmq.XSUB, endpoints.heartbeats[0]),
        ("beats1", zmq.XSUB, endpoints.heartbeats[1]),
    ):
        sockets[name] = context.socket(kind)
        sockets[name].setsockopt(zmq.LINGER, 0)
        sockets[name].connect(endpoint)
    return sockets


def wait_for_terminals(expected: set, terminals: dict, drain, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not expected <= terminals.keys() and time.monotonic() < deadline:
        time.sleep(0.01)
        drain()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.timeout(600)
def test_fuzzed_frames_across_every_socket_leave_the_group_serving_and_leak_nothing() -> None:
    config, set_args = deployment(
        # 64 blocks: the prefix cache (bounded by them) is full long before the warm-up ends.
        **{"parallel.tensor_parallel_size": 2, "model.max_model_len": 64, "cache.num_blocks": 64}
    )
    endpoints = group_endpoints(config.runtime, 0, 2)
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    inbox.setsockopt(zmq.LINGER, 0)
    reply_to = f"{endpoints.tasks}-fuzz-inbox"
    inbox.bind(reply_to)
    sockets = fuzz_sockets(context, endpoints)
    rng = random.Random(0)
    expected: set[str] = set()
    terminals: dict[str, int] = {}

    def drain_inbox() -> None:
        while inbox.poll(0):
            frames = inbox.recv_multipart()
            message = RESULT_DECODER.decode(frames)
            for delta in getattr(message, "outputs", []):
                if delta.finish_reason is not None:
                    terminals[delta.request_id] = terminals.get(delta.request_id, 0) + 1

    targets = ["tasks", "admin", "acks", "control", "beats0", "beats1"]
    with running(config, set_args, "--fake-executor") as (driver, peer):
        for i in range(NUM_FRAMES):
            if i == WARM_UP_FRAMES:
                rss_warm = rss_bytes(driver.pid)
            target = rng.choices(targets, weights=[14, 2, 2, 2, 1, 1])[0]
            frames, well_formed = fuzz_frame(rng, reply_to, f"fuzz-{i}")
            if target in ("control", "beats0", "beats1"):
                frames = [b"\x07" + b"".join(frames)]  # XSUB upstream data
            sockets[target].send_multipart(frames)
            if target == "tasks" and well_formed:
                expected.add(f"fuzz-{i}")
            if i % 1000 == 999:  # in step with the driver: memory held, not frames queued
                wait_for_terminals(expected, terminals, drain_inbox, timeout_s=10)
        wait_for_terminals(expected, terminals, drain_inbox, timeout_s=60)
        status = admin(config, "status").data
        time.sleep(1)  # what is still queued in the sockets is read, and freed
        rss_after = rss_bytes(driver.pid)
        assert peer.poll() is None
    for sock in [inbox, *sockets.values()]:
        sock.close()
    context.term()
    assert expected <= terminals.keys(), (
        f"{len(expected - terminals.keys())} submits got no terminal output"
    )
    assert all(terminals[rid] == 1 for rid in expected), "a request got two terminal outputs"
    assert status["state"] == "READY"
    assert (
        status["kv_blocks_used"] == 0 and status["num_running"] == 0 and status["num_waiting"] == 0
    )
    assert status["num_rejected_frames"] > 10_000
    # No leak: after the allocator's warm-up, 100,000 more frames grow the driver by <= 5%.
    print(f"driver RSS {rss_warm / 2**20:.1f} MiB -> {rss_after / 2**20:.1f} MiB")
    assert rss_after <= 1.05 * rss_warm
