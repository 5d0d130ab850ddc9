"""A burst of 10,000 requests from 4 clients to a DP=2 deployment: every request gets exactly one
terminal output. The model is a tiny random one, so that the burst tests the sockets, queues and
scheduler at their own pace rather than waiting on the model's products (with the embedded model,
those took most of the test's minute)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.tiny_models import build_tiny_model
from tests.workers import deployment, running

NUM_REQUESTS, NUM_CLIENTS = 10_000, 4


@pytest.mark.slow
def test_10000_requests_from_4_clients_each_get_exactly_one_terminal_output(tmp_path) -> None:
    build_tiny_model("llama", tmp_path)
    overrides = {
        "model.path": str(tmp_path),
        "model.dtype": "float32",
        "model.max_model_len": 256,
        "cache.num_blocks": 1024,
        "scheduler.max_num_seqs": 256,
        "parallel.data_parallel_size": 2,
    }
    config, set_args = deployment(**overrides)
    vocab_size = json.loads((tmp_path / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [
        [rng.randrange(1, vocab_size) for _ in range(rng.randint(1, 6))]
        for _ in range(NUM_REQUESTS)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)

    async def scenario():
        clients = [Client.from_config(config) for _ in range(NUM_CLIENTS)]
        for client in clients:
            await client.start()
        try:
            streams = [
                await clients[i % NUM_CLIENTS].submit(prompt, params, request_id=f"load-{i}")
                for i, prompt in enumerate(prompts)
            ]

            async def terminals(stream) -> list:
                return [(out, stream.group) async for out in stream if out.finished]

            results = await asyncio.wait_for(asyncio.gather(*(terminals(s) for s in streams)), 240)
            await asyncio.sleep(0.5)  # a duplicate terminal would arrive by now
            return (
                results,
                [c.num_unexpected_outputs for c in clients],
                [group for r in results for _, group in r],
            )
        finally:
            for client in clients:
                await client.close()

    with running(config, set_args):
        results, unexpected, groups = asyncio.run(scenario())
    bad = [r for r in results if not (len(r) == 1 and r[0][0].finish_reason == "length")]
    assert not bad, f"{len(bad)} requests did not end with one length output: {bad[:3]}"
    assert unexpected == [0] * NUM_CLIENTS
    assert min(groups.count(0), groups.count(1)) > NUM_REQUESTS // 4
