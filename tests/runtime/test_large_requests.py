"""Requests too large for a group end with exactly one terminal output, quickly: a prompt longer
than max_model_len is refused by the Client itself once it knows the group's limit, and a frame
too large to decode is answered by the driver from its head (wire/submit_head.py)."""

from __future__ import annotations

import asyncio
import time

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.runtime.inprocess import RawClient, inprocess_config, run

LONG_PROMPT = [1000 + i % 5000 for i in range(60_000)]  # 3 bytes a token: 180 KB


async def only_output(client: Client, prompt: list[int], params: SamplingParams):
    """The request's one output (its terminal one), and how long it took."""
    started = time.monotonic()
    outputs = [out async for out in await client.submit(prompt, params)]
    assert len(outputs) == 1, outputs
    return outputs[0], time.monotonic() - started


async def until_ready(client: Client) -> None:
    while client.group_states() != ["READY"]:
        await asyncio.sleep(0.01)


def test_a_prompt_over_max_model_len_ends_in_the_client_without_being_sent(tmp_path) -> None:
    async def scenario(group, client: Client):
        await until_ready(client)  # its beats carry max_model_len
        out, seconds = await only_output(client, LONG_PROMPT, SamplingParams(max_tokens=4))
        return out, seconds, group.driver.rejected.total, client

    (out, seconds, rejected, client), _ = run(scenario, inprocess_config(tmp_path))
    assert out.finish_reason == "error" and out.error_kind == "invalid"
    assert out.error == "prompt has 60000 tokens; max_model_len is 256"
    assert seconds < 1.0 and rejected == 0  # never sent
    assert client.num_unexpected_outputs == 0


def test_frames_too_large_to_decode_are_answered_from_their_head(tmp_path) -> None:
    config = inprocess_config(tmp_path)

    async def scenario(group, client: Client):
        # Multi-MB through the Client: a short prompt with a 3 MB stop string.
        huge_stop = SamplingParams(max_tokens=4, stop=("x" * 3_000_000,))
        by_size, size_seconds = await only_output(client, [1, 2, 3], huge_stop)
        # A prompt of 2M tokens from a client that does not check it (10 MB).
        raw = RawClient(config, "raw")
        try:
            started = time.monotonic()
            await raw.submit("long", [1000] * 2_000_000, SamplingParams(max_tokens=4))
            by_length, length_seconds = (await raw.receive()).outputs, time.monotonic() - started
        finally:
            raw.close()
        await asyncio.sleep(0.2)  # a second terminal output would arrive by now
        served = await client.generate([1, 2, 3], SamplingParams(max_tokens=3))
        return by_size, by_length, max(size_seconds, length_seconds), served, client

    (by_size, by_length, seconds, served, client), group = run(scenario, config)
    assert by_size.finish_reason == "error" and by_size.error_kind == "invalid"
    assert "is larger than any valid request" in by_size.error
    assert "model.max_model_len 256" in by_size.error
    [out] = by_length
    assert out.request_id == "long" and out.error_kind == "invalid"
    assert out.error == "prompt has 2000000 tokens; max_model_len is 256"
    assert seconds < 2.0
    assert group.driver.rejected.total == 2
    assert served.finish_reason == "length" and client.num_unexpected_outputs == 0


def test_a_request_over_max_message_bytes_is_never_sent(tmp_path) -> None:
    """A group cuts off a connection that sends more than runtime.max_message_bytes, unread;
    the Client refuses such a request itself."""
    config = inprocess_config(tmp_path, **{"runtime.max_message_bytes": 1 << 20})

    async def scenario(group, client: Client):
        params = SamplingParams(max_tokens=4, stop=("x" * (2 << 20),))
        out, _ = await only_output(client, [1, 2, 3], params)
        served = await client.generate([1, 2, 3], SamplingParams(max_tokens=3))
        return out, served

    (out, served), group = run(scenario, config)
    assert out.error_kind == "invalid" and "exceeds runtime.max_message_bytes" in out.error
    assert served.finish_reason == "length" and group.driver.rejected.total == 0
