"""A driver rank run as a task of the test's own event loop, with the fake executor and real
sockets in a temporary ipc directory: no subprocess."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import zmq
import zmq.asyncio

from aioworker.config import WorkerConfig, load_config
from aioworker.core.fake_executor import build_fake, fake_token
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.driver import Driver
from aioworker.runtime.peer import Peer
from aioworker.runtime.rank import Rank
from aioworker.wire.admin_client import send
from aioworker.wire.client import Client
from aioworker.wire.health import RankState
from aioworker.wire.protocol import RESULT_DECODER, AdminReply, AdminRequest, SubmitRequest, encode
from aioworker.wire.transport import group_endpoints

BLOCK_SIZE = 16


def inprocess_config(runtime_dir: Path, **overrides) -> WorkerConfig:
    settings = {
        "runtime.name": "inproc",
        "runtime.runtime_dir": str(runtime_dir),
        "runtime.heartbeat_interval_s": 0.2,
        "cache.block_size": BLOCK_SIZE,
        "cache.num_blocks": 64,
        "model.max_model_len": 256,
        **overrides,
    }
    return load_config(overrides=settings)


class InProcessGroup:
    """A driver rank run as a task of this test's event loop."""

    def __init__(
        self,
        config: WorkerConfig,
        peer_faults: dict | None = None,
        load_seconds: float = 0.0,
        **faults,
    ) -> None:
        """With tensor_parallel_size > 1 the peers run in this loop too, each with a fake
        executor given `peer_faults`. `load_seconds`: how long the driver stays LOADING."""
        self.config = config
        self.load_seconds = load_seconds
        self.rank = Rank(config, 0, 0)
        self.driver = Driver(self.rank)
        self.executor, self.task = self._start(self.rank, self.driver, faults)
        self.peer_ranks = [
            Rank(config, 0, i) for i in range(1, config.parallel.tensor_parallel_size)
        ]
        self.peer_tasks = [
            self._start(rank, Peer(rank), peer_faults or {})[1] for rank in self.peer_ranks
        ]

    def _start(self, rank: Rank, role, faults: dict):
        executor, loaded = build_fake(self.config, **faults)

        def build(report_phase):  # on the rank's load thread
            time.sleep(self.load_seconds if rank.index == 0 else 0.0)
            return executor, loaded

        task = asyncio.ensure_future(rank.run(role, build))
        return executor, task

    async def stop(self) -> None:
        """Stop every rank that still runs and wait for all of them."""
        for rank in [self.rank, *self.peer_ranks]:
            rank.lifecycle.stop()  # a no-op when it stopped already
        await asyncio.wait_for(asyncio.gather(self.task, *self.peer_tasks), 10)

    async def ready(self) -> None:
        while self.rank.lifecycle.state is not RankState.READY:
            assert not self.task.done(), self.task.result()
            await asyncio.sleep(0.01)

    @property
    def used_blocks(self) -> int:
        return self.driver.core.block_manager.num_used_blocks

    async def admin(self, command: str, argument: str = "", check: bool = True) -> AdminReply:
        request = AdminRequest(command=command, argument=argument)
        reply = (await asyncio.to_thread(send, self.config, 0, request, 5.0)).reply
        assert reply.ok or not check, reply.message
        return reply


def expected_tokens(prompt_len: int, num: int) -> list[int]:
    """What the fake executor samples after a prompt of `prompt_len` tokens."""
    return [fake_token(prompt_len + i) for i in range(num)]


def run(
    scenario,
    config: WorkerConfig,
    step_seconds: float = 0.002,
    peer_faults: dict | None = None,
    timeout_s: float = 30.0,
    **faults,
):
    """Run `scenario(group, client)` against a fresh in-process group; its result and the group.
    The fake executor takes `step_seconds` per step and any other FakeExecutor fault."""

    async def main():
        group = InProcessGroup(config, peer_faults, step_seconds=step_seconds, **faults)
        await asyncio.wait_for(group.ready(), 10)
        try:
            async with Client.from_config(config) as client:
                result = await asyncio.wait_for(scenario(group, client), timeout_s)
        finally:
            await group.stop()
        return result, group

    return asyncio.run(main())


class RawClient:
    """A PUSH to the driver's tasks and a bound PULL inbox, for frames the Client never sends."""

    def __init__(
        self,
        config: WorkerConfig,
        name: str,
        context: zmq.asyncio.Context | None = None,
        rcvhwm: int | None = None,
    ) -> None:
        self._owns_context = context is None
        self.context = context or zmq.asyncio.Context()
        self.reply_to = f"ipc://{config.runtime.runtime_dir}/{name}-inbox"
        self.inbox = self.context.socket(zmq.PULL)
        if rcvhwm is not None:
            self.inbox.setsockopt(zmq.RCVHWM, rcvhwm)
        self.inbox.bind(self.reply_to)
        self.tasks = self.context.socket(zmq.PUSH)
        self.tasks.connect(group_endpoints(config.runtime, 0, 1).tasks)

    async def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        message = SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt, params=params, reply_to=self.reply_to
        )
        await self.tasks.send_multipart(encode(message))

    async def receive(self, timeout_s: float = 5.0):
        return RESULT_DECODER.decode(await asyncio.wait_for(self.inbox.recv_multipart(), timeout_s))

    def close(self) -> None:
        self.inbox.close(linger=0)
        self.tasks.close(linger=0)
        if self._owns_context:
            self.context.term()
