"""The driver in this process with the fake executor: real sockets in a temporary ipc directory,
no subprocess. Admission, steps, abort and drain, with the outputs and KV blocks they leave."""

from __future__ import annotations

import asyncio

from aioworker.config import WorkerConfig
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from aioworker.wire.health import RankState
from aioworker.wire.protocol import Outputs, Rejected
from tests.runtime.inprocess import (
    BLOCK_SIZE,
    InProcessGroup,
    RawClient,
    expected_tokens,
    inprocess_config,
    run,
)


def test_requests_are_admitted_stepped_and_leave_no_blocks(inproc_config: WorkerConfig) -> None:
    prompts = [list(range(1, 1 + n)) for n in (3, 20, 40)]

    async def scenario(group: InProcessGroup, client: Client):
        refused = await client.generate([1, 40000], SamplingParams(max_tokens=4))
        completions = await asyncio.gather(
            *(client.generate(p, SamplingParams(max_tokens=6)) for p in prompts)
        )
        await group.admin("shutdown")
        return refused, completions

    (refused, completions), group = run(scenario, inproc_config)
    assert refused.finish_reason == "error" and "outside the vocabulary" in refused.error
    assert refused.error_kind == "invalid"
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.token_ids == expected_tokens(len(prompt), 6)
        assert completion.finish_reason == "length"
    assert group.used_blocks == 0
    assert group.task.result() == 0  # exit code: a clean stop


def test_a_paused_group_holds_its_blocks_and_an_abort_frees_them(
    inproc_config: WorkerConfig,
) -> None:
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

    (first, rest, (used, owned, computed)), group = run(scenario, inproc_config)
    # The sequence owns exactly the blocks its computed tokens fill, and nobody else owns any.
    assert used == owned == -(-computed // BLOCK_SIZE) and computed >= 40
    assert first.token_ids == expected_tokens(40, 1)
    terminal = rest[-1]
    assert terminal.finish_reason == "abort" and terminal.error == "aborted by the client"
    assert group.used_blocks == 0


def test_drain_finishes_what_runs_refuses_the_rest_and_stops(inproc_config: WorkerConfig) -> None:
    async def scenario(group: InProcessGroup, client: Client):
        running = [await client.submit([5, 6, 7], SamplingParams(max_tokens=30)) for _ in range(3)]
        await running[0].__anext__()
        await group.admin("drain", "10")
        refused = await client.generate([1, 2], SamplingParams(max_tokens=2))
        finished = [[out async for out in stream] for stream in running]
        return refused, finished

    (refused, finished), group = run(scenario, inproc_config, step_seconds=0.005)
    assert refused.finish_reason == "error" and "draining" in refused.error
    assert refused.error_kind == "unavailable"
    for outputs in finished:
        assert outputs[-1].finish_reason == "length"
    assert group.task.result() == 0
    assert group.rank.lifecycle.state is RankState.STOPPED
    assert group.used_blocks == 0


def test_a_duplicate_id_from_the_same_client_is_rejected_without_ending_the_first(
    inproc_config: WorkerConfig,
) -> None:
    async def scenario(group: InProcessGroup, client: Client):
        raw, other = RawClient(group.config, "raw"), RawClient(group.config, "other")
        try:
            await raw.submit("dup", [1, 2, 3], SamplingParams(max_tokens=20))
            first = await raw.receive()
            await raw.submit("dup", [4, 5], SamplingParams(max_tokens=2))
            await other.submit("dup", [4, 5], SamplingParams(max_tokens=2))
            refused_elsewhere = await other.receive()
            messages = [first]
            while not any(o.finished for m in messages[-1:] for o in getattr(m, "outputs", [])):
                messages.append(await raw.receive())
            return messages, refused_elsewhere
        finally:
            raw.close()
            other.close()

    (messages, refused_elsewhere), _ = run(scenario, inproc_config, step_seconds=0.005)
    rejected = [m for m in messages if isinstance(m, Rejected)]
    outputs = [o for m in messages if isinstance(m, Outputs) for o in m.outputs]
    assert [r.request_id for r in rejected] == ["dup"] and "already in flight" in rejected[0].reason
    assert [o.finish_reason for o in outputs if o.finished] == ["length"]
    assert [t for o in outputs for t in o.token_ids] == expected_tokens(3, 20)
    [error] = refused_elsewhere.outputs
    assert error.finish_reason == "error" and "already in use" in error.error


def test_past_max_waiting_a_request_is_refused_as_overloaded(tmp_path) -> None:
    config = inprocess_config(tmp_path, **{"scheduler.max_waiting": 2})

    async def scenario(group: InProcessGroup, client: Client):
        await group.admin("pause")  # nothing starts: every request waits
        waiting = [await client.submit([1, 2], SamplingParams(max_tokens=2)) for _ in range(2)]
        refused = await client.generate([3, 4], SamplingParams(max_tokens=2))
        await group.admin("resume")
        finished = [[out async for out in stream][-1] for stream in waiting]
        return refused, finished

    (refused, finished), group = run(scenario, config)
    assert refused.finish_reason == "error" and refused.error_kind == "overloaded"
    assert "scheduler.max_waiting" in refused.error
    assert [out.finish_reason for out in finished] == ["length", "length"]
    assert group.used_blocks == 0


def test_a_repeated_prompt_hits_the_cache_until_an_operator_resets_it(
    inproc_config: WorkerConfig,
) -> None:
    prompt = list(range(1, 41))  # two full blocks before its last token
    params = SamplingParams(max_tokens=3)

    async def scenario(group: InProcessGroup, client: Client):
        seen = []
        for step in ("first", "again", "reset", "after reset"):
            if step == "reset":
                seen.append((await group.admin("reset-prefix-cache")).message)
                continue
            completion = await client.generate(prompt, params)
            status = (await group.admin("status")).data
            seen.append(
                (completion.token_ids, status["prefix_hit_tokens"], status["kv_blocks_cached"])
            )
        return seen

    (first, again, reset, after), group = run(scenario, inproc_config)
    assert first[0] == again[0] == after[0] == expected_tokens(len(prompt), 3)
    assert (first[1], again[1]) == (0, 2 * BLOCK_SIZE)  # the second found two blocks computed
    assert first[2] == again[2] >= 2
    assert reset.startswith("prefix cache reset:") and f"{again[2]} cached block(s)" in reset
    assert after[1] == again[1]  # nothing left to hit after the reset
    assert group.used_blocks == 0
