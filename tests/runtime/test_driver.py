"""The driver in this process with the fake executor: real sockets in a temporary ipc directory,
no subprocess. Admission, steps, abort and drain, with the outputs and KV blocks they leave."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioworker.config import WorkerConfig, load_config
from aioworker.core.fake_executor import build_fake, fake_token
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.driver import Driver
from aioworker.runtime.rank import Rank
from aioworker.wire.admin_client import send
from aioworker.wire.client import Client
from aioworker.wire.health import RankState
from aioworker.wire.protocol import AdminRequest

BLOCK_SIZE = 16


@pytest.fixture
def config(tmp_path: Path) -> WorkerConfig:
    return load_config(
        overrides={
            "runtime.name": "inproc",
            "runtime.runtime_dir": str(tmp_path),
            "runtime.heartbeat_interval_s": 0.2,
            "cache.block_size": BLOCK_SIZE,
            "cache.num_blocks": 64,
            "model.max_model_len": 256,
        }
    )


class InProcessGroup:
    """A driver rank run as a task of this test's event loop."""

    def __init__(self, config: WorkerConfig, step_seconds: float) -> None:
        self.config = config
        self.rank = Rank(config, 0, 0)
        self.driver = Driver(self.rank)
        build = lambda report_phase: build_fake(config, step_seconds=step_seconds)  # noqa: E731
        self.task = asyncio.ensure_future(self.rank.run(self.driver, build))

    async def ready(self) -> None:
        while self.rank.lifecycle.state is not RankState.READY:
            assert not self.task.done(), self.task.result()
            await asyncio.sleep(0.01)

    @property
    def used_blocks(self) -> int:
        return self.driver.core.block_manager.num_used_blocks

    async def admin(self, command: str, argument: str = "") -> None:
        request = AdminRequest(command=command, argument=argument)
        reply = (await asyncio.to_thread(send, self.config, 0, request, 5.0)).reply
        assert reply.ok, reply.message


def expected_tokens(prompt_len: int, num: int) -> list[int]:
    """What the fake executor samples after a prompt of `prompt_len` tokens."""
    return [fake_token(prompt_len + i) for i in range(num)]


def run(scenario, config: WorkerConfig, step_seconds: float = 0.002):
    async def main():
        group = InProcessGroup(config, step_seconds)
        await asyncio.wait_for(group.ready(), 10)
        try:
            async with Client.from_config(config) as client:
                result = await asyncio.wait_for(scenario(group, client), 30)
        finally:
            group.rank.lifecycle.stop()  # a no-op when the scenario stopped it already
            await asyncio.wait_for(group.task, 10)
        return result, group

    return asyncio.run(main())


def test_requests_are_admitted_stepped_and_leave_no_blocks(config: WorkerConfig) -> None:
    prompts = [list(range(1, 1 + n)) for n in (3, 20, 40)]

    async def scenario(group: InProcessGroup, client: Client):
        refused = await client.generate([1, 40000], SamplingParams(max_tokens=4))
        completions = await asyncio.gather(
            *(client.generate(p, SamplingParams(max_tokens=6)) for p in prompts)
        )
        await group.admin("shutdown")
        return refused, completions

    (refused, completions), group = run(scenario, config)
    assert refused.finish_reason == "error" and "outside the vocabulary" in refused.error
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.token_ids == expected_tokens(len(prompt), 6)
        assert completion.finish_reason == "length"
    assert group.used_blocks == 0
    assert group.task.result() == 0  # exit code: a clean stop


def test_a_paused_group_holds_its_blocks_and_an_abort_frees_them(config: WorkerConfig) -> None:
    async def scenario(group: InProcessGroup, client: Client):
        stream = await client.submit(list(range(1, 41)), SamplingParams(max_tokens=200))
        first = await stream.__anext__()
        await group.admin("pause")
        await group.driver.control.wait_until(lambda: not group.driver.core.in_flight)
        [seq] = group.driver.core.scheduler.running
        blocks_while_paused = (group.used_blocks, len(seq.block_table), seq.num_computed_tokens)
        await client.abort(first.request_id)
        rest = [out async for out in stream]
        return first, rest, blocks_while_paused

    (first, rest, (used, owned, computed)), group = run(scenario, config)
    # The sequence owns exactly the blocks its computed tokens fill, and nobody else owns any.
    assert used == owned == -(-computed // BLOCK_SIZE) and computed >= 40
    assert first.token_ids == expected_tokens(40, 1)
    terminal = rest[-1]
    assert terminal.finish_reason == "abort" and terminal.error == "aborted by the client"
    assert group.used_blocks == 0


def test_drain_finishes_what_runs_refuses_the_rest_and_stops(config: WorkerConfig) -> None:
    async def scenario(group: InProcessGroup, client: Client):
        running = [await client.submit([5, 6, 7], SamplingParams(max_tokens=30)) for _ in range(3)]
        await running[0].__anext__()
        await group.admin("drain", "10")
        refused = await client.generate([1, 2], SamplingParams(max_tokens=2))
        finished = [[out async for out in stream] for stream in running]
        return refused, finished

    (refused, finished), group = run(scenario, config, step_seconds=0.005)
    assert refused.finish_reason == "error" and "draining" in refused.error
    for outputs in finished:
        assert outputs[-1].finish_reason == "length"
    assert group.task.result() == 0
    assert group.rank.lifecycle.state is RankState.STOPPED
    assert group.used_blocks == 0
