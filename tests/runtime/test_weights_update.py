"""Weights lifecycle with real worker processes: update from disk while requests stream (each
pause mode), rollback on every rank when one rank's shard is bad, release and resume memory."""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file, save_file

from aioworker.compute.weights.staging import write_checksums
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from tests.conftest import make_engine
from tests.tiny_models import build_tiny_model
from tests.workers import admin, deployment, running

SMALL = {"cache.num_blocks": 256, "model.max_model_len": 256}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROBES = [[3, 4, 5], [10, 11, 12, 13, 14, 15], [7] * 20]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two checkpoints of the same shapes: the old weights and the new."""
    root = tmp_path_factory.mktemp("weights")
    build_tiny_model("qwen3", root / "old", seed=0)
    build_tiny_model("qwen3", root / "new", seed=1)
    return root / "old", root / "new"


@pytest.fixture(scope="module")
def expected_new(models):
    engine = make_engine(models[1], **SMALL)
    try:
        return [c.token_ids for c in engine.generate(PROBES, GREEDY)]
    finally:
        engine.close()


def greedy_probes(config) -> list[list[int]]:
    async def scenario():
        async with Client.from_config(config) as client:
            return [
                c.token_ids
                for c in await asyncio.gather(*(client.generate(p, GREEDY) for p in PROBES))
            ]

    return asyncio.run(scenario())


def update_while_streaming(config, path, mode: str, num_requests: int = 32):
    """32 requests stream; after their first outputs the weights are updated. Returns every
    request's outputs and the admin reply."""
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)

    async def scenario():
        async with Client.from_config(config) as client:
            streams = [await client.submit([20 + i, 21, 22], params) for i in range(num_requests)]
            first = [await stream.__anext__() for stream in streams]
            reply = await asyncio.to_thread(
                admin, config, "update-weights", str(path), timeout=60, version=2, mode=mode
            )
            rest = await asyncio.gather(*(_collect(stream) for stream in streams))
            await asyncio.sleep(0.2)
            assert client.num_unexpected_outputs == 0
            return [[f, *r] for f, r in zip(first, rest, strict=True)], reply

    return asyncio.run(scenario())


def probes_after_update(config) -> list[list[int]]:
    """The probes on the new weights, asserting that KV cached before the update served none of
    them, and that the cache fills again on the new weights."""
    hits = admin(config, "status").data["prefix_hit_tokens"]
    after = greedy_probes(config)
    assert admin(config, "status").data["prefix_hit_tokens"] == hits
    assert greedy_probes(config) == after
    assert admin(config, "status").data["prefix_hit_tokens"] > hits  # [7] * 20: a full block
    return after


async def _collect(stream) -> list:
    return [out async for out in stream]


@pytest.mark.parametrize("mode", ["wait", "keep", "abort"])
def test_update_from_disk_while_32_requests_stream(models, expected_new, mode: str) -> None:
    old, new = models
    # keep: with n-gram speculation too, whose drafts are verified across the swap.
    speculative = {"speculative.method": "ngram", "speculative.dynamic": False}
    extra = speculative if mode == "keep" else {}
    config, set_args = deployment(**{"model.path": str(old), **SMALL, **extra})
    with running(config, set_args):
        greedy_probes(config)  # the old weights' KV of the probes, cached
        outputs, reply = update_while_streaming(config, new, mode)
        status = admin(config, "status").data
        after = probes_after_update(config)
    assert reply.ok, reply.message
    assert status["weights_version"] == 2 and status["last_weights_update_s"] > 0
    terminals = [outs[-1] for outs in outputs]
    assert all(out.finished for out in terminals)  # nothing lost
    versions = [[o.weights_version for o in outs if o.token_ids] for outs in outputs]
    if mode == "wait":  # running requests finished on the old weights before the swap
        assert all(t.finish_reason == "length" for t in terminals)
        assert all(set(v) == {0} for v in versions)
    elif mode == "keep":  # the same requests continued on the new weights
        assert all(t.finish_reason == "length" for t in terminals)
        assert all(v[0] == 0 and v[-1] == 2 and sorted(v) == v for v in versions)
        assert status["spec_accepted_tokens"] > 0
    else:
        assert all(t.finish_reason == "abort" and "weights update" in t.error for t in terminals)
    assert after == expected_new


def test_a_bad_shard_on_one_tensor_parallel_rank_rolls_both_back(models, tmp_path) -> None:
    old, new = models
    # NaN in the last embedding row: only rank 1's half of the vocabulary holds it.
    tensors = load_file(str(new / "model.safetensors"))
    tensors["model.embed_tokens.weight"][-1, 0] = float("nan")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_bytes((new / "config.json").read_bytes())
    save_file(tensors, str(bad / "model.safetensors"))
    config, set_args = deployment(
        **{"model.path": str(old), **SMALL, "parallel.tensor_parallel_size": 2}
    )
    with running(config, set_args):
        before = greedy_probes(config)
        reply = admin(config, "update-weights", str(bad), timeout=60)
        status = admin(config, "status").data
        after = greedy_probes(config)
    assert not reply.ok
    assert "rank 1" in reply.message and "NaN" in reply.message and "rank 0" not in reply.message
    assert status["weights_version"] == 0 and status["state"] == "READY"
    assert after == before  # both ranks kept the old weights


def test_a_checksum_mismatch_is_refused(models, tmp_path) -> None:
    old, new = models
    checked = tmp_path / "checked"
    checked.mkdir()
    for name in ("config.json", "model.safetensors"):
        (checked / name).write_bytes((new / name).read_bytes())
    write_checksums(checked)
    tensors = load_file(str(checked / "model.safetensors"))
    tensors["model.norm.weight"] += 1e-3  # a silent corruption: still finite, same shape
    save_file(tensors, str(checked / "model.safetensors"))
    config, set_args = deployment(**{"model.path": str(old), **SMALL})
    with running(config, set_args):
        reply = admin(config, "update-weights", str(checked), timeout=60)
    assert (
        not reply.ok
        and "checksum mismatch" in reply.message
        and "model.norm.weight" in reply.message
    )


def test_release_and_resume_memory_keep_serving_the_same_tokens(models) -> None:
    old, _ = models
    config, set_args = deployment(**{"model.path": str(old), **SMALL})
    with running(config, set_args):
        before = greedy_probes(config)
        released = admin(config, "release-memory", timeout=60)
        assert released.ok and admin(config, "status").data["state"] == "WEIGHTS_CLEARED"

        async def submit_while_released():
            async with Client.from_config(config) as client:
                pending = asyncio.ensure_future(client.generate(PROBES[0], GREEDY))
                await asyncio.sleep(0.3)
                assert not pending.done()  # queued, not refused
                resumed = await asyncio.to_thread(admin, config, "resume-memory", timeout=60)
                return resumed, await pending

        resumed, queued = asyncio.run(submit_while_released())
        after = greedy_probes(config)
    assert resumed.ok, resumed.message
    assert queued.token_ids == before[0]
    assert after == before


def test_pushed_tensors_update_the_weights(models, expected_new) -> None:
    """A trainer without IPC pushes bf16/fp32 tensors as raw ZeroMQ frames."""
    from aioworker.wire.admin_client import send
    from aioworker.wire.protocol import AdminRequest, TensorMeta

    old, new = models
    tensors = load_file(str(new / "model.safetensors"))
    metas = [
        TensorMeta(name, str(t.dtype).removeprefix("torch."), list(t.shape))
        for name, t in tensors.items()
    ]
    frames = [t.contiguous().view(torch.uint8).numpy().tobytes() for t in tensors.values()]
    config, set_args = deployment(**{"model.path": str(old), **SMALL})
    with running(config, set_args):
        greedy_probes(config)
        request = AdminRequest(command="update-weights", pushed=metas, mode="abort")
        reply = send(config, 0, request, 60, raw_frames=frames).reply
        after = probes_after_update(config)
    assert reply.ok, reply.message
    assert after == expected_new
