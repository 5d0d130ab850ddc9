"""The eager steps a CUDA rank runs while WARMING: one of each kind of launch that serving's
eager steps make and the graphs do not (a few rows, each token-count specialization, each class
of split count alone and beside a prefill, and verify queries where speculation is on)."""

from __future__ import annotations

import types

import msgspec
import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers.attention.triton_decode import choose_num_splits  # noqa: E402
from aioworker.compute.step.eager_warm_up import (  # noqa: E402
    MIXED_PREFILL,
    decode_counts,
    split_class,
    warm_steps,
)
from aioworker.core.plan import StepPlan  # noqa: E402


def engine_splits(max_model_len: int):
    return lambda batch: choose_num_splits(batch, 8, max_model_len, 132)


def test_split_counts_fall_in_triton_s_three_specializations() -> None:
    assert [split_class(s) for s in (1, 16, 32, 2, 3, 17)] == [
        "one", "by16", "by16", "other", "other", "other",
    ]  # fmt: skip


@pytest.mark.parametrize("max_model_len", [1024, 2048, 4096, 131072])
def test_decode_counts_are_the_first_batch_of_each_class(max_model_len: int) -> None:
    splits = engine_splits(max_model_len)
    counts = decode_counts(256, splits)
    classes = {split_class(splits(batch)) for batch in range(1, 257)}
    assert sorted(split_class(splits(count)) for count in counts) == sorted(classes)
    for count in counts:  # no smaller batch has that class
        assert all(split_class(splits(b)) != split_class(splits(count)) for b in range(1, count))


def test_the_steps_cover_few_rows_each_token_class_and_every_split_class_alone_and_mixed() -> None:
    splits = engine_splits(2048)
    steps = warm_steps(256, splits)
    tokens = {step.num_tokens for step in steps}
    assert 1 in tokens and any(2 <= t <= 8 for t in tokens)  # the products' row classes
    assert any(t % 16 == 0 for t in tokens) and any(t > 1 and t % 16 for t in tokens)
    decodes = [step for step in steps if set(step.nums) == {1}]
    mixed = [step for step in steps if step.nums[0] == MIXED_PREFILL and len(step.nums) > 1]
    every_class = {split_class(splits(b)) for b in range(1, 256)}
    assert {split_class(splits(len(s.nums))) for s in decodes} == every_class
    assert {split_class(splits(len(s.nums) - 1)) for s in mixed} == every_class
    assert all(not step.drafts for step in steps)  # no speculation, no verify queries
    assert max(len(step.nums) for step in steps) <= 256


def test_a_batch_taking_larger_key_tiles_starts_a_class_of_its_own() -> None:
    """Decode steps from device.decode_attention_tile_128_from_programs (sequences x KV heads)
    launch another build of decode attention: the warm-up runs the first such batch alone and
    beside a prefill, even where its split count's class was already warmed."""
    from aioworker.compute.layers.attention.cuda_backend import CudaAttentionBackend

    splits = engine_splits(2048)
    backend = CudaAttentionBackend(16, tile_128_from_programs=1024)

    def build_of(num_seqs: int):
        return backend.decode_build_for(num_seqs, 8)

    assert decode_counts(256, splits, build_of) == sorted(set(decode_counts(256, splits)) | {128})
    steps = warm_steps(256, splits, build_of=build_of)
    assert {len(s.nums) for s in steps if set(s.nums) == {1}} >= {128}
    assert {len(s.nums) - 1 for s in steps if s.nums[0] == MIXED_PREFILL} >= {128}


def test_long_prefills_reach_the_step_budget_and_no_further() -> None:
    """MoE's expert tiles change with a prefill's length: the warm-up prefills 64, 256, 1,024...
    tokens, as many as the step's token budget allows (what profiling sized the cache for)."""
    lengths = {s.num_tokens for s in warm_steps(64, engine_splits(8192), step_tokens=2048)}
    assert {64, 256, 1024} <= lengths and max(lengths) <= 2048
    assert max(s.num_tokens for s in warm_steps(64, engine_splits(8192))) < 64


def test_verify_queries_add_mixed_steps_whose_decodes_verify_drafts() -> None:
    plain = warm_steps(64, engine_splits(1024))
    steps = warm_steps(64, engine_splits(1024), verify_queries=5)
    verify = steps[len(plain) :]
    assert steps[: len(plain)] == plain and verify
    for step in verify:
        assert step.nums[0] == MIXED_PREFILL and set(step.nums[1:]) == {5}
        assert step.drafts == (0,) + (4,) * (len(step.nums) - 1)


def test_a_warm_step_is_a_valid_plan_of_new_sequences_each_sampling() -> None:
    step = warm_steps(64, engine_splits(1024), verify_queries=3)[-1]
    plan = msgspec.msgpack.decode(msgspec.msgpack.encode(step.plan()), type=StepPlan)
    assert plan.num_scheduled_tokens == list(step.nums)
    assert plan.num_tokens == step.num_tokens and set(plan.start_positions) == {0}
    assert all(plan.sample) and plan.num_draft_tokens == list(step.drafts)
    assert len(plan.seq_ids) == len(set(plan.seq_ids)) == len(step.nums)


@pytest.mark.parametrize("verify_queries", [0, 4], ids=["plain", "verify"])
def test_the_warm_up_runs_through_the_cuda_runner_and_writes_only_the_scratch_block(
    tmp_path, monkeypatch, verify_queries: int
) -> None:
    """The CUDA runner's eager path and its Triton kernels, on the CPU (Triton's interpreter;
    the few CUDA calls the runner makes stand in): every warm step runs, and of the cache only
    the scratch block, which no sequence owns, is written."""
    from aioworker.checkpoint.model_config import load_model_config
    from aioworker.compute.kv_cache import allocate_kv_cache
    from aioworker.compute.layers.attention import select_cuda_backend
    from aioworker.compute.model_loading import build_model, linear_methods
    from aioworker.compute.parallel import SINGLE
    from aioworker.compute.sampling.sampler import Sampler
    from aioworker.compute.step import eager_warm_up
    from aioworker.compute.step.cuda_runner import CudaModelRunner
    from aioworker.config import load_config
    from tests.tiny_models import build_tiny_model

    sms = types.SimpleNamespace(multi_processor_count=8)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: sms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args: self)
    build_tiny_model("qwen3", tmp_path)
    cfg = load_model_config(tmp_path)
    config = load_config(overrides={"model.path": str(tmp_path), "device.kind": "cpu"})
    cpu = torch.device("cpu")
    model = build_model(cfg, 256, SINGLE, cpu, torch.float32, linear_methods(cfg, config, cpu))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    layers = model.attention_layers()
    allocate_kv_cache(layers, 17, 16, torch.float32, cpu)  # 16 blocks and the scratch block
    runner = CudaModelRunner(
        model, select_cuda_backend(config.device, 16), Sampler(0, cpu, one_pass=False), cpu,
        SINGLE, block_size=16, num_blocks=16, max_num_seqs=40, max_model_len=256,
        max_capture_batch_size=0, max_verify_queries=verify_queries,
    )  # fmt: skip
    ran = []
    forward = runner.forward_eager
    monkeypatch.setattr(
        runner, "forward_eager", lambda step, plan: ran.append(plan) or forward(step, plan)
    )
    before = [layer.k_cache.clone() for layer in layers]
    eager_warm_up.warm_up_eager(runner, step_tokens=8192)  # prefills capped at max_model_len
    expected = warm_steps(runner.scratch_row, runner.num_splits, runner.max_verify_queries, 256)
    assert {64, 256} <= {sum(plan.num_scheduled_tokens) for plan in ran}
    assert [plan.num_scheduled_tokens for plan in ran] == [list(s.nums) for s in expected]
    assert any(plan.has_drafts for plan in ran) == (verify_queries > 0)
    for old, layer in zip(before, layers, strict=True):
        assert torch.equal(old[:16], layer.k_cache[:16])  # the sequences' blocks untouched
        assert not torch.equal(old[16], layer.k_cache[16])  # the scratch block written
