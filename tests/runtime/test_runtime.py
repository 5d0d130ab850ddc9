"""The rank process over real sockets and processes: concurrency, tensor and data parallelism,
aborts, and bad frames on every socket."""

from __future__ import annotations

import asyncio
import json
import random
import time

import msgspec
import pytest
import zmq

from aioworker.core.guided import GuidedParams
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from aioworker.wire.protocol import (
    PROTOCOL_VERSION,
    RESULT_DECODER,
    VERSION_FRAME,
    SubmitRequest,
    encode,
)
from aioworker.wire.transport import group_endpoints
from tests.compute.test_parallel import listening_addresses
from tests.conftest import EMBEDDED_OVERRIDES, make_engine
from tests.guided_schemas import PERSON, PROMPTS
from tests.logprob_checks import assert_logprobs_close
from tests.test_quantization_composes import QUESTIONS
from tests.workers import admin, deployment, running


def random_prompts(num: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200, 30000) for _ in range(rng.randint(3, 40))] for _ in range(num)]


def mixed_params(num: int, max_tokens: int) -> list[SamplingParams]:
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [
        greedy
        if i % 2
        else SamplingParams(temperature=0.8, seed=i, max_tokens=max_tokens, ignore_eos=True)
        for i in range(num)
    ]


async def generate_all(clients: list[Client], prompts, params) -> list:
    async def one(i: int):
        return await clients[i % len(clients)].generate(prompts[i], params[i])

    return await asyncio.gather(*(one(i) for i in range(len(prompts))))


@pytest.mark.slow
def test_64_concurrent_requests_from_2_clients_equal_the_offline_engine(
    embedded_engine, embedded_model_dir
) -> None:
    prompts, params = random_prompts(64, seed=5), mixed_params(64, max_tokens=6)
    expected = [c.token_ids for c in embedded_engine.generate(prompts, params)]
    config, set_args = deployment(**{"model.path": str(embedded_model_dir), **EMBEDDED_OVERRIDES})

    async def scenario():
        clients = [Client.from_config(config), Client.from_config(config)]
        for client in clients:
            await client.start()
        try:
            completions = await generate_all(clients, prompts, params)
            await asyncio.sleep(0.2)  # any duplicate terminal output would arrive by now
            return completions, [c.num_unexpected_outputs for c in clients]
        finally:
            for client in clients:
                await client.close()

    with running(config, set_args):
        completions, unexpected = asyncio.run(scenario())
    assert [c.finish_reason for c in completions] == ["length"] * 64
    assert [c.token_ids for c in completions] == expected
    assert unexpected == [0, 0]


@pytest.mark.slow
def test_tensor_parallel_2_equals_tp_1(embedded_engine, embedded_model_dir) -> None:
    # SmolLM2 has 9 query / 3 KV heads: two ranks take 2 and 1 KV heads with their queries.
    prompts = [
        embedded_engine.encode(q, chat=True)
        for q in ("What is the capital of France?", "Count to five.", PROMPTS[0], PROMPTS[1])
    ]
    # Logprobs too: the driver samples from logits gathered across both ranks' vocab shards.
    scored = SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5, prompt_logprobs=5
    )
    # Guided: only the driver masks and samples; a bad schema fails its request alone.
    guided = SamplingParams(temperature=0.0, max_tokens=96, guided=GuidedParams(json_schema=PERSON))
    bad = msgspec.structs.replace(guided, guided=GuidedParams(json_schema={"type": "wat"}))
    params = [scored, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), guided, bad]
    expected = embedded_engine.generate(prompts, params)
    assert expected[3].finish_reason == "error" and json.loads(expected[2].text)
    # Then three samples of a prompt already computed: the driver's cache, followed by the peer.
    samples = SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True, n=3)
    expected_samples = [c.token_ids for c in embedded_engine.generate(prompts[1:2], samples)]
    settings = {
        "model.path": str(embedded_model_dir),
        **EMBEDDED_OVERRIDES,
        "parallel.tensor_parallel_size": 2,
    }
    config, set_args = deployment(**settings)

    async def scenario():
        async with Client.from_config(config) as client:
            completions = await generate_all([client], prompts, params)
            return completions, await client.generate_samples(prompts[1], samples)

    dist_port = int(group_endpoints(config.runtime, 0, 2).dist_init.rsplit(":", 1)[1])
    with running(config, set_args):
        completions, sampled = asyncio.run(scenario())
        status = admin(config, "status").data
        rendezvous = listening_addresses(dist_port)
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    assert completions[3].finish_reason == "error" and completions[3].error_kind == "invalid"
    assert "guided.json_schema does not compile" in completions[3].error
    assert [c.token_ids for c in sampled] == expected_samples
    assert status["prefix_hit_tokens"] > 0
    assert (status["grammars_compiled"], status["guided_refused"]) == (1, 1)
    assert status["guided_compiling"] == 0 and status["grammar_cache_bytes"] > 0
    assert_logprobs_close(completions[0].logprobs, expected[0].logprobs)
    assert_logprobs_close(completions[0].prompt_logprobs, expected[0].prompt_logprobs)
    assert completions[1].logprobs is None
    # The rendezvous listens where the group does (127.0.0.1), not on every interface.
    assert rendezvous and all(address.is_loopback for address in rendezvous)


@pytest.mark.slow
def test_tensor_parallel_2_with_int4_weights_equals_tp_1(embedded_model_dir) -> None:
    """model.quantization = "wint4": each rank quantizes its own shard (the row-parallel ones,
    o_proj's 384 and 192 inputs and down_proj's 768, start on int4 groups of 32), and the greedy
    tokens are one rank's (prompts clear of near ties: tests/test_quantization_composes.py)."""
    settings = {"model.path": str(embedded_model_dir), **EMBEDDED_OVERRIDES}
    settings["model.quantization"] = "wint4"
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
    one_rank = make_engine(embedded_model_dir, **settings)
    try:
        prompts = [one_rank.encode(q, chat=True) for q in QUESTIONS]
        expected = one_rank.generate(prompts, params)
    finally:
        one_rank.close()
    config, set_args = deployment(**settings, **{"parallel.tensor_parallel_size": 2})

    async def scenario():
        async with Client.from_config(config) as client:
            return await generate_all([client], prompts, [params] * len(prompts))

    with running(config, set_args):
        completions = asyncio.run(scenario())
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    for got, want in zip(completions, expected, strict=True):
        # The int4 kernel multiplies in bfloat16, and two ranks' partial products are rounded
        # before they add up: up to 0.06 apart here.
        assert_logprobs_close(got.logprobs, want.logprobs, tolerance=0.15)


def test_data_parallel_spreads_a_burst_and_aborts_within_one_step() -> None:
    config, set_args = deployment(**{"parallel.data_parallel_size": 2})

    async def burst():
        async with Client.from_config(config) as client:
            # Spreading is what is tested, not the start: a group whose first beat has not been
            # read yet is not routed to (on a loaded machine that took a burst's first 150).
            deadline = time.monotonic() + 30
            while client.group_states() != ["READY", "READY"] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            prompts = random_prompts(200, seed=1)
            params = [SamplingParams(max_tokens=20)] * 200
            completions = await generate_all([client], prompts, params)
            return [c.group for c in completions], [c.finish_reason for c in completions]

    async def abort_running():
        async with Client.from_config(config) as client:
            stream = await client.submit([1, 2, 3], SamplingParams(max_tokens=1000))
            outputs = []
            async for out in stream:
                outputs.append(out)
                if len(outputs) == 3:
                    await client.abort(out.request_id)
                    aborted_at = out.step_id
            return outputs, aborted_at

    with running(config, set_args, "--fake-executor", "--fake-step-ms", "20"):
        groups, reasons = asyncio.run(burst())
        outputs, aborted_at = asyncio.run(abort_running())
    assert reasons == ["length"] * 200
    assert min(groups.count(0), groups.count(1)) >= 50  # each group served >= 25%
    terminal = outputs[-1]
    assert terminal.finish_reason == "abort" and terminal.token_ids == []
    # The abort reached the group while step `aborted_at + 1` could already be running; it ends
    # the request right after that step: at most one more token.
    assert len(outputs) <= 5 and terminal.step_id <= aborted_at + 1


class _Inbox:
    """A bound PULL socket standing in for a client's reply_to."""

    def __init__(self, context: zmq.Context, endpoint_base: str) -> None:
        self.sock = context.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"{endpoint_base}-inbox"
        self.sock.bind(self.endpoint)

    def recv(self, timeout_s: float = 3.0):
        assert self.sock.poll(timeout_s * 1000), "no reply came"
        return RESULT_DECODER.decode(self.sock.recv_multipart())


def _connected(context: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _submit_frame(reply_to: str, **fields) -> bytes:
    """A submit body with any field replaced, encoded without the protocol's types."""
    body = {
        "type": "submit",
        "request_id": "r",
        "prompt_token_ids": [1, 2],
        "params": {},
        "reply_to": reply_to,
    }
    return msgspec.msgpack.encode({**body, **fields})


def _frames_with_error_replies(reply_to: str) -> dict[str, list[bytes]]:
    """Bad frames whose reply_to can still be read: each gets an error reply naming the problem."""

    def frame(**fields) -> bytes:
        return _submit_frame(reply_to, **fields)

    return {
        "wrong type": [VERSION_FRAME, frame(params={"max_tokens": "many"})],
        "unknown tag": [VERSION_FRAME, frame(type="nope")],
        "bad version": [bytes([PROTOCOL_VERSION - 1]), frame()],  # a client one version behind
        "token out of range": [VERSION_FRAME, frame(request_id="big", prompt_token_ids=[40000])],
        "too long": [VERSION_FRAME, frame(request_id="long", prompt_token_ids=[1] * 65)],
        "bad param": [VERSION_FRAME, frame(request_id="neg", params={"temperature": -1.0})],
    }


def _generate(tasks: zmq.Socket, inbox: _Inbox, max_tokens: int):
    """Submit a good request over the raw socket; its tokens and terminal output."""
    params = SamplingParams(max_tokens=max_tokens)
    message = SubmitRequest(
        request_id="ok", prompt_token_ids=[1, 2], params=params, reply_to=inbox.endpoint
    )
    tasks.send_multipart(encode(message))
    tokens = []
    while True:
        [delta] = inbox.recv().outputs
        tokens += delta.token_ids
        if delta.finish_reason:
            return tokens, delta


def test_bad_frames_get_error_replies_or_counted_drops_and_the_rank_keeps_serving() -> None:
    config, set_args = deployment(**{"parallel.tensor_parallel_size": 2, "model.max_model_len": 64})
    endpoints = group_endpoints(config.runtime, 0, 2)
    context = zmq.Context()
    inbox = _Inbox(context, endpoints.tasks)
    with running(config, set_args, "--fake-executor"):
        tasks = _connected(context, zmq.PUSH, endpoints.tasks)
        acks = _connected(context, zmq.PUSH, endpoints.acks)
        control = _connected(context, zmq.XSUB, endpoints.control)
        admin_sock = _connected(context, zmq.DEALER, endpoints.admin)
        replies = _frames_with_error_replies(inbox.endpoint)
        for frames in replies.values():
            tasks.send_multipart(frames)
            [delta] = inbox.recv().outputs
            assert delta.finish_reason == "error" and delta.error
        # Frames with no reply path are dropped and counted.
        tasks.send_multipart([random.randbytes(50)])
        tasks.send_multipart([VERSION_FRAME, b"\xc1\xff garbage"])
        acks.send_multipart([VERSION_FRAME, b"not an ack"])
        control.send(b"\x05 upstream garbage")
        admin_sock.send_multipart([VERSION_FRAME, b"\x93garbage"])
        assert admin_sock.poll(3000)
        reply = admin_sock.recv_multipart()
        assert b"malformed" in reply[-1]
        # Still serving: a good request completes.
        tokens, delta = _generate(tasks, inbox, max_tokens=3)
        assert delta.finish_reason == "length" and len(tokens) == 3
        status = admin(config, "status")
        assert status.data["state"] == "READY"
        assert status.data["num_rejected_frames"] >= 5 + len(replies) - 3
        for sock in (tasks, acks, control, admin_sock, inbox.sock):
            sock.close()
    context.term()
