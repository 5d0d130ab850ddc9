"""Weights operations against faults and signals, in process with the fake executor: a failed or
timed-out phase gives the group back its state, a drain waits for the operation, a commit that
fails somewhere stops the group, pushed tensors leave no files, and shutdown answers the caller."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path

import pytest

from aioworker.config import WorkerConfig
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime import weights as weights_module
from aioworker.runtime.state import ExitCode
from aioworker.wire.admin_client import send
from aioworker.wire.health import RankState
from aioworker.wire.protocol import AdminRequest, TensorMeta
from tests.runtime.inprocess import expected_tokens, inprocess_config, run

LONG = SamplingParams(max_tokens=30)


def admin_in_thread(config: WorkerConfig, timeout_s: float = 10.0, **fields):
    """An admin command sent from a thread (the caller's loop runs on); a future of its reply."""
    request = AdminRequest(**fields)
    return asyncio.ensure_future(asyncio.to_thread(send, config, 0, request, timeout_s))


async def wait_for_state(group, state: RankState) -> None:
    while group.rank.lifecycle.state is not state:
        await asyncio.sleep(0.005)


def test_a_phase_that_raises_gives_the_group_back_its_state(
    inproc_config: WorkerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args):
        raise ValueError("no such weights")

    monkeypatch.setattr(weights_module, "_stage_phase", broken)

    async def scenario(group, client):
        reply = await group.admin("update-weights", "/nowhere", check=False)
        after = await client.generate([1, 2], SamplingParams(max_tokens=3))
        return reply, group.rank.lifecycle.state, after

    (reply, state, after), _ = run(scenario, inproc_config)
    assert not reply.ok and "ValueError: no such weights" in reply.message
    assert state is RankState.READY
    assert after.token_ids == expected_tokens(2, 3)


def test_a_peer_that_never_acks_times_out_and_the_group_serves_on(tmp_path: Path) -> None:
    config = inprocess_config(tmp_path, **{"parallel.tensor_parallel_size": 2})

    async def scenario(group, client):
        group.driver.peers.phase_timeout_s = 0.3
        reply = await group.admin("update-weights", "/weights", check=False)
        after = await client.generate([1, 2], SamplingParams(max_tokens=3))
        return reply, group.rank.lifecycle.state, after

    (reply, state, after), _ = run(scenario, config, peer_faults={"phase_seconds": 60.0})
    assert not reply.ok and "did not finish stage within 0.3s" in reply.message
    assert state is RankState.READY
    assert after.finish_reason == "length"


@pytest.mark.parametrize("how", ["admin drain", "SIGTERM"])
def test_a_drain_during_an_update_waits_for_it_then_finishes_the_requests(
    inproc_config: WorkerConfig, how: str
) -> None:
    async def scenario(group, client):
        streams = [await client.submit([7, 8, 9], LONG) for _ in range(3)]
        update = admin_in_thread(group.config, command="update-weights", argument="/w", mode="keep")
        await wait_for_state(group, RankState.UPDATING_WEIGHTS)
        if how == "SIGTERM":
            group.driver.on_stop_signal()
        else:
            drain = await group.admin("drain", "30")
            assert "deferred" in drain.message
        during = group.rank.lifecycle.state
        refused = await client.generate([1], SamplingParams(max_tokens=1))
        outputs = [[out async for out in stream] for stream in streams]
        return (await update).reply, during, refused, outputs

    (update, during, refused, outputs), group = run(scenario, inproc_config, phase_seconds=0.3)
    assert update.ok and during is RankState.UPDATING_WEIGHTS
    assert refused.finish_reason == "error" and "draining" in refused.error
    for out in outputs:
        assert [o.finish_reason for o in out if o.finished] == ["length"]
        assert sum(len(o.token_ids) for o in out) == 30
    assert group.rank.lifecycle.state is RankState.STOPPED and group.task.result() == 0
    assert group.used_blocks == 0


def test_a_drain_while_memory_is_released_aborts_and_never_steps(
    inproc_config: WorkerConfig,
) -> None:
    async def scenario(group, client):
        stream = await client.submit([7, 8, 9], SamplingParams(max_tokens=1000))
        await stream.__anext__()
        await group.admin("release-memory")
        await group.admin("drain", "30")
        return [out async for out in stream]

    outputs, group = run(scenario, inproc_config)
    assert outputs[-1].finish_reason == "abort" and "memory is released" in outputs[-1].error
    assert group.task.result() == 0  # a step on released weights would have failed the rank
    assert group.executor.phases_run == ["release"]


def test_resume_takes_the_same_hold_as_an_update(inproc_config: WorkerConfig) -> None:
    async def scenario(group, client):
        await group.admin("release-memory")
        resume = admin_in_thread(group.config, command="resume-memory")
        await asyncio.sleep(0.1)  # the resume phase takes 0.3 s
        update = await group.admin("update-weights", "/w", check=False)
        return (await resume).reply, update, group.rank.lifecycle.state

    (resume, update, state), _ = run(scenario, inproc_config, phase_seconds=0.3)
    assert resume.ok and state is RankState.READY
    assert not update.ok and "another weights operation is in progress" in update.message


def test_a_commit_that_fails_on_a_peer_stops_the_group(tmp_path: Path) -> None:
    config = inprocess_config(tmp_path, **{"parallel.tensor_parallel_size": 2})

    async def scenario(group, client):
        reply = await group.admin("update-weights", "/w", check=False)
        await asyncio.wait_for(asyncio.gather(group.task, *group.peer_tasks), 10)
        return reply

    reply, group = run(scenario, config, peer_faults={"fail_phase": "commit"})
    assert not reply.ok and "ranks may hold different weights" in reply.message
    assert group.task.result() == ExitCode.WEIGHTS_DIVERGED
    assert group.peer_tasks[0].result() == ExitCode.PEER_LOST  # told by the driver's Shutdown


def test_pushed_tensors_are_written_off_the_loop_and_removed(
    inproc_config: WorkerConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    threads = []
    write = weights_module.write_safetensors

    def recording_write(*args):
        threads.append(threading.current_thread())
        write(*args)

    monkeypatch.setattr(weights_module, "write_safetensors", recording_write)
    pushed = [TensorMeta(name="w", dtype="float32", shape=[2])]
    request = AdminRequest(command="update-weights", pushed=pushed)

    async def scenario(group, client):
        frames = [bytes(8)]
        return (await asyncio.to_thread(send, group.config, 0, request, 5.0, frames)).reply

    reply, _ = run(scenario, inproc_config)
    assert reply.ok, reply.message
    assert threads and threads[0] is not threading.main_thread()
    assert not list(tmp_path.glob("aioworker-pushed-*"))


def test_shutdown_answers_an_update_in_progress_at_once(inproc_config: WorkerConfig) -> None:
    async def scenario(group, client):
        update = admin_in_thread(
            group.config, timeout_s=30, command="update-weights", argument="/w"
        )
        await wait_for_state(group, RankState.UPDATING_WEIGHTS)
        started = asyncio.get_running_loop().time()
        await group.admin("shutdown")
        reply = (await update).reply
        return reply, asyncio.get_running_loop().time() - started

    (reply, waited), _ = run(scenario, inproc_config, phase_seconds=20.0)
    assert not reply.ok and "update-weights not finished: worker shutting down" in reply.message
    assert waited < 5.0
