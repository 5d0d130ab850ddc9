"""Clients in number and in trouble, against a driver in this process: thousands of distinct
clients, a client that reads slowly, and one that vanishes with streams open."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import zmq.asyncio

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.runtime.inprocess import RawClient, expected_tokens, inprocess_config, run


def test_5000_distinct_clients_each_get_their_one_terminal_output(tmp_path: Path) -> None:
    config = inprocess_config(tmp_path, **{"runtime.max_client_sockets": 64})
    num_clients = 5000

    context = zmq.asyncio.Context()

    async def one_client(group, index: int):
        raw = RawClient(group.config, f"c{index}", context)
        try:
            await raw.submit(f"r{index}", [1 + index % 7], SamplingParams(max_tokens=1))
            message = await raw.receive()
        finally:
            raw.close()
        return message.outputs

    async def scenario(group, client):
        results = []
        for first in range(0, num_clients, 50):  # 50 clients at a time, each a socket
            batch = range(first, first + 50)
            results += await asyncio.gather(*(one_client(group, i) for i in batch))
        return results, group.driver.results.num_sockets, await group.admin("status")

    started = time.monotonic()
    (results, num_sockets, status), group = run(scenario, config, 0.0, timeout_s=120)
    print(f"{num_clients} clients in {time.monotonic() - started:.1f}s")
    context.term()
    assert all(len(r) == 1 and r[0].finish_reason == "length" for r in results)
    assert num_sockets <= 2 * 64
    assert status.data["state"] == "READY" and group.used_blocks == 0


def test_a_client_that_reads_slowly_loses_no_output(tmp_path: Path) -> None:
    settings = {"runtime.result_hwm": 1, "model.max_model_len": 4096, "cache.num_blocks": 4096}
    config = inprocess_config(tmp_path, **settings)
    num_requests, num_tokens = 16, 3000

    async def scenario(group, client):
        raw = RawClient(group.config, "slow", rcvhwm=1)
        try:
            for i in range(num_requests):
                await raw.submit(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=num_tokens))
            while group.driver.requests:  # the driver finishes while nobody reads
                await asyncio.sleep(0.05)
            tokens, terminals = {}, []
            while len(terminals) < num_requests:
                for out in (await raw.receive()).outputs:
                    tokens.setdefault(out.request_id, []).extend(out.token_ids)
                    terminals += [out.finish_reason] if out.finished else []
            return tokens, terminals
        finally:
            raw.close()

    (tokens, terminals), group = run(scenario, config, 0.0, timeout_s=60)
    assert terminals == ["length"] * num_requests
    assert all(t == expected_tokens(3, num_tokens) for t in tokens.values())


def test_a_client_that_vanishes_has_its_requests_aborted_and_blocks_freed(
    tmp_path: Path,
) -> None:
    config = inprocess_config(tmp_path)

    async def scenario(group, client):
        raw = RawClient(group.config, "doomed")
        for i in range(50):
            await raw.submit(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=100000))
        await raw.receive()
        raw.close()  # gone, with 50 streams open
        gone_at = asyncio.get_running_loop().time()
        while group.driver.requests:
            await asyncio.sleep(0.05)
        return asyncio.get_running_loop().time() - gone_at, group.used_blocks

    (waited, used_blocks), group = run(scenario, config, step_seconds=0.01)
    assert used_blocks == 0
    assert waited < 1.0 + 1.0  # probed after a second of stall, and a second of slack


def test_a_deadline_aborts_the_request_in_the_group(inproc_config) -> None:
    async def scenario(group, client):
        stream = await client.submit([1, 2], SamplingParams(max_tokens=100000), timeout_s=0.3)
        outputs = [out async for out in stream]
        return outputs, group.used_blocks

    (outputs, used_blocks), _ = run(scenario, inproc_config, step_seconds=0.01)
    assert outputs[-1].finish_reason == "abort" and "deadline of 0.3s" in outputs[-1].error
    assert used_blocks == 0


def test_a_client_that_closes_with_streams_open_aborts_them(inproc_config) -> None:
    async def scenario(group, client):
        other = Client.from_config(group.config)
        streams = [await other.submit([1, 2], SamplingParams(max_tokens=100000)) for _ in range(5)]
        await streams[0].__anext__()
        reply_file = Path(other.reply_endpoint.removeprefix("ipc://"))
        await other.close()
        closed_at = asyncio.get_running_loop().time()
        while group.driver.requests:
            await asyncio.sleep(0.01)
        return asyncio.get_running_loop().time() - closed_at, reply_file.exists()

    (waited, file_left), group = run(scenario, inproc_config, step_seconds=0.01)
    assert waited < 0.5  # aborted at once, not a probe or a timeout later
    assert not file_left and group.used_blocks == 0


def test_a_rank_removes_its_ipc_socket_files(tmp_path: Path) -> None:
    config = inprocess_config(tmp_path)

    async def scenario(group, client):
        return sorted(p.name for p in tmp_path.iterdir())

    during, _ = run(scenario, config)
    assert any(name.endswith("-tasks") for name in during)
    assert not list(tmp_path.iterdir())


def test_a_live_client_that_reads_nothing_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    settings = {"runtime.client_timeout_s": 3.0, "runtime.result_hwm": 1}
    settings |= {"model.max_model_len": 8192, "cache.num_blocks": 4096}
    config = inprocess_config(tmp_path, **settings)

    async def scenario(group, client):
        raw = RawClient(group.config, "asleep", rcvhwm=1)  # listening, never reading
        try:
            for i in range(4):
                await raw.submit(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=100000))
            while len(group.driver.requests) < 4:
                await asyncio.sleep(0.005)
            started = asyncio.get_running_loop().time()
            while group.driver.requests:
                await asyncio.sleep(0.05)
            return asyncio.get_running_loop().time() - started, group.used_blocks
        finally:
            raw.close()

    (waited, used_blocks), _ = run(scenario, config, step_seconds=0.005)
    # Not at the probe a second into the stall (it still listens): at the timeout.
    assert 2.5 <= waited < 3.0 + 2.0 and used_blocks == 0
