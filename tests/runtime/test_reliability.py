"""Operations and failure handling with real processes: drain on SIGTERM, failing and hung steps,
lost peers, metrics, record and replay."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.state import ExitCode
from aioworker.wire.client import Client
from tests.runtime.inprocess import RawClient
from tests.workers import deployment, read_log, running, start_worker, wait_ready

FAKE_STEP = ("--fake-executor", "--fake-step-ms", "20")


def submit_all(config, num: int, params: SamplingParams, on_first_output=None):
    """Submit `num` requests; returns every output of every request, in arrival order."""

    async def scenario():
        async with Client.from_config(config) as client:
            streams = [await client.submit([1, 2, 3], params) for _ in range(num)]
            first = asyncio.Event()

            async def consume(stream):
                outputs = []
                async for out in stream:
                    outputs.append(out)
                    first.set()
                return outputs

            tasks = [asyncio.ensure_future(consume(s)) for s in streams]
            await first.wait()
            if on_first_output is not None:
                on_first_output()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            await asyncio.sleep(0.2)
            return results, client.num_unexpected_outputs

    return asyncio.run(scenario())


def test_sigterm_drains_50_requests_in_flight_and_exits_0() -> None:
    config, set_args = deployment()
    worker = start_worker(0, set_args, *FAKE_STEP)
    try:
        wait_ready(config, [worker])
        sent_at = []

        def terminate() -> None:
            sent_at.append(time.monotonic())
            worker.send_signal(signal.SIGTERM)

        results, unexpected = submit_all(config, 50, SamplingParams(max_tokens=20), terminate)
        code = worker.wait(config.runtime.drain_timeout_s)
    finally:
        worker.kill()
    assert code == ExitCode.OK
    assert unexpected == 0
    terminals = [outputs[-1] for outputs in results]
    assert len(terminals) == 50 and all(out.finished for out in terminals)
    # In flight when SIGTERM came, so they were finished, not refused.
    assert all(
        out.finish_reason == "length" and sum(len(o.token_ids) for o in outs) == 20
        for out, outs in zip(terminals, results, strict=True)
    )


def test_a_new_request_while_draining_is_refused_with_a_reason() -> None:
    config, set_args = deployment()
    with running(config, set_args, *FAKE_STEP) as (worker,):

        async def scenario():
            async with Client.from_config(config) as client:
                long = await client.submit([1, 2], SamplingParams(max_tokens=50))
                await long.__anext__()
                worker.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.1)
                refused = await client.generate([1, 2], SamplingParams(max_tokens=5))
                return refused, [out async for out in long][-1]

        refused, last = asyncio.run(scenario())
        assert refused.finish_reason == "error" and "draining" in refused.error
        assert last.finish_reason == "length"
        assert worker.wait(10) == ExitCode.OK


def test_a_failing_step_fails_every_request_and_exits_non_zero() -> None:
    config, set_args = deployment()
    worker = start_worker(0, set_args, *FAKE_STEP, "--fail-at-step", "5")
    try:
        wait_ready(config, [worker])
        results, _ = submit_all(config, 20, SamplingParams(max_tokens=50))
        code = worker.wait(10)
    finally:
        worker.kill()
    terminals = [outputs[-1] for outputs in results]
    assert all(
        out.finish_reason == "error" and "injected failure" in out.error for out in terminals
    )
    assert code == ExitCode.FAILED


def test_a_hung_step_dumps_stacks_and_exits_hung() -> None:
    config, set_args = deployment(**{"runtime.hung_step_timeout_s": 0.5})
    worker = start_worker(0, set_args, "--fake-executor", "--fake-step-ms", "60000")
    try:
        wait_ready(config, [worker])

        async def submit_one():
            async with Client.from_config(config) as client:
                await client.submit([1, 2], SamplingParams(max_tokens=2))
                await asyncio.sleep(0.2)

        asyncio.run(submit_one())
        started = time.monotonic()
        code = worker.wait(10)
        stderr = read_log(worker)
    finally:
        worker.kill()
    assert code == ExitCode.HUNG
    assert time.monotonic() - started < 5
    assert "made no progress" in stderr and "Thread 0x" in stderr  # faulthandler's stack dump


def failed_at(process) -> float:
    """When a rank logged that it fails (the epoch time of its JSON log record)."""
    for line in read_log(process).splitlines():
        if line.startswith("{") and "failing (exit" in line:
            return json.loads(line)["time"]
    raise AssertionError(f"the rank never logged its failure:\n{read_log(process)[-2000:]}")


@pytest.mark.parametrize(
    ("lost", "sig"),
    [("peer", signal.SIGKILL), ("peer", signal.SIGSTOP), ("driver", signal.SIGKILL)],
)
def test_a_lost_rank_is_noticed_within_3_beats_and_the_group_exits(lost: str, sig: int) -> None:
    settings = {"parallel.tensor_parallel_size": 2, "runtime.log_format": "json"}
    config, set_args = deployment(**settings)
    driver, peer = (
        start_worker(0, set_args, "--fake-executor"),
        start_worker(1, set_args, "--fake-executor"),
    )
    victim, survivor = (peer, driver) if lost == "peer" else (driver, peer)
    try:
        wait_ready(config, [driver, peer])
        time.sleep(2 * config.runtime.heartbeat_interval_s)  # both have heard each other beat
        victim.send_signal(sig)
        lost_at = time.time()
        code = survivor.wait(10)
    finally:
        for process in (driver, peer):
            process.kill()
    assert code == ExitCode.PEER_LOST
    interval = config.runtime.heartbeat_interval_s
    # 3 intervals of silence, and one beat of slack (the last beat came before the loss).
    assert failed_at(survivor) - lost_at <= 3 * interval + interval


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_metrics_are_served_with_conventional_names() -> None:
    port = free_port()
    config, set_args = deployment(**{"runtime.metrics_port": port})
    with running(config, set_args, *FAKE_STEP):
        submit_all(config, 5, SamplingParams(max_tokens=4))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for name in (
        "aioworker:num_requests_running",
        "aioworker:num_requests_waiting",
        "aioworker:kv_cache_usage_perc",
        "aioworker:time_to_first_token_seconds_bucket",
        "aioworker:time_per_output_token_seconds_bucket",
        "aioworker:e2e_request_latency_seconds_count",
        "aioworker:prompt_tokens_total",
    ):
        assert name in text, name
    assert 'aioworker:generation_tokens_total{group="0"} 20.0' in text
    assert 'aioworker:request_success_total{finished_reason="length",group="0"} 5.0' in text


REPLAY_CACHE = {"cache.num_blocks": 64}


def record(tmp_path, model_dir, requests, max_model_len: int = 256, unchecked=()):
    """Serve `requests` (prompt, params) on the model with runtime.record_path; the recording.
    `unchecked` requests go straight to the worker (the Client would refuse a prompt longer than
    max_model_len itself); their terminal outputs follow the others'."""
    recording = tmp_path / "run.rec"
    overrides = {"model.path": str(model_dir), "model.max_model_len": max_model_len}
    run_dir = {"runtime.runtime_dir": str(tmp_path / "run")}
    config, set_args = deployment(
        **REPLAY_CACHE, **overrides, **run_dir, **{"runtime.record_path": str(recording)}
    )

    async def scenario():
        async with Client.from_config(config) as client:
            done = await asyncio.gather(*(client.generate(p, params) for p, params in requests))
        raw = RawClient(config, "unchecked")
        try:
            for i, (prompt, params) in enumerate(unchecked):
                await raw.submit(f"unchecked-{i}", prompt, params)
                done.append((await raw.receive(timeout_s=30)).outputs[-1])
        finally:
            raw.close()
        return done

    with running(config, set_args):
        completions = asyncio.run(scenario())
    return recording, completions


def replay(recording, model_dir, max_model_len: int = 256) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aioworker.cli.main", "replay", str(recording)]
    command += ["--model", str(model_dir), "--max-model-len", str(max_model_len)]
    command += ["--set", f"cache.num_blocks={REPLAY_CACHE['cache.num_blocks']}"]
    command += ["--dtype", "float32"]  # as recorded (tests.workers.deployment pins it)
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_recording_replays_to_the_same_tokens(tmp_path) -> None:
    from tests.tiny_models import build_tiny_model

    model_dir = tmp_path / "model"
    build_tiny_model("qwen3", model_dir)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13] * 20]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    requests = [(p, params) for p in prompts for params in (greedy, seeded)]
    recording, _ = record(tmp_path, model_dir, requests)

    same = replay(recording, model_dir)
    assert same.returncode == 0, same.stderr
    assert "6 reproducible" in same.stdout and "6 identical, 0 different" in same.stdout
    other_dir = tmp_path / "other"
    build_tiny_model("qwen3", other_dir, seed=1)
    assert replay(recording, other_dir).returncode == 1


def test_requests_refused_when_recorded_are_refused_again(tmp_path) -> None:
    from tests.tiny_models import build_tiny_model

    model_dir = tmp_path / "model"
    build_tiny_model("qwen3", model_dir)  # a vocabulary of 384 tokens
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    requests = [([5, 6, 7], params), ([5, 1000], params)]
    too_long = [([9] * 40, params)]
    recording, completions = record(tmp_path, model_dir, requests, 32, unchecked=too_long)
    assert [c.finish_reason for c in completions] == ["length", "error", "error"]

    same = replay(recording, model_dir, max_model_len=32)
    assert same.returncode == 0, same.stderr
    assert "3 reproducible" in same.stdout and "3 identical, 0 different" in same.stdout
    # With room for its prompt, the 40-token request is accepted where it was refused.
    longer = replay(recording, model_dir, max_model_len=256)
    assert longer.returncode == 1, longer.stderr
    assert "2 identical, 1 different" in longer.stdout
    assert "prompt has 40 tokens; max_model_len is 32" in longer.stdout


def test_json_logs_carry_rank_and_pid() -> None:
    import json

    import zmq

    from aioworker.wire.transport import group_endpoints

    config, set_args = deployment(**{"runtime.log_format": "json"})
    worker = start_worker(0, set_args, "--fake-executor")
    try:
        wait_ready(config, [worker])
        context = zmq.Context()
        tasks = context.socket(zmq.PUSH)
        tasks.connect(group_endpoints(config.runtime, 0, 1).tasks)
        tasks.send_multipart([b"not a message"])  # logged as a dropped frame
        time.sleep(0.5)
        tasks.close(linger=0)
        context.term()
    finally:
        worker.terminate()
        worker.wait(10)
    records = [json.loads(line) for line in read_log(worker).splitlines() if line.startswith("{")]
    assert records and all(r["rank"] == "0.0" and r["pid"] == worker.pid for r in records)
    assert any("dropped 1 malformed frames" in r["message"] for r in records)
