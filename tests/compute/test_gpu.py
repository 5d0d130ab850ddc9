"""GPU tests (run on the GPU machine with `pytest -m gpu`): bf16 parity with transformers, CUDA
graphs against eager, the profiled cache inside its budget, xformers against our kernel, and the
ZeroMQ process path with 256 concurrent requests."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest
import torch

from aioworker.config import load_config
from aioworker.core.sampling_params import SamplingParams
from tests.logprob_checks import assert_entry_matches, assert_logprobs_close
from tests.plans import empty_plan, prefill_plan
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.gpu

GPU = {"device.kind": "cuda", "cache.num_blocks": 512, "model.max_model_len": 1024}
PROMPT_LENGTHS = (3, 17, 50, 200)


def engine(model_dir, **overrides):
    from aioworker.engine import LLMEngine

    settings = {"model.path": str(model_dir), **GPU, **overrides}
    return LLMEngine.from_config(load_config(overrides=settings), progress=False)


def prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def prefill_logits(eng, token_ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position through the CUDA runner's eager path."""
    runner = eng.executor.runner
    num_blocks = -(-len(token_ids) // eng.loaded.block_size)
    plan = prefill_plan(token_ids, list(range(num_blocks)))

    @torch.inference_mode()
    def run() -> torch.Tensor:
        runner.apply_plan_state(plan)
        hidden = runner.forward(plan, runner.prepare(plan)).hidden
        runner.apply_plan_state(empty_plan(-1, released_seq_ids=(-1,)))
        return runner.model.compute_logits(hidden).float()

    return eng.executor.call(run).result()


def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device="cuda")
    out = model.generate(ids, max_new_tokens=num_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


# bf16 logits carry about 3 significant digits: where the reference's two best tokens are this
# close, either choice is right and the implementations may differ.
NEAR_TIE = 1e-2


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "ernie4_5_moe"])
def test_bf16_parity_with_transformers(arch: str, tmp_path) -> None:
    """Greedy tokens equal transformers' for 32 steps; where the reference itself had a near-tie,
    the check continues with the reference's tokens as context (teacher forcing), so every one
    of the 32 positions is compared. Prefill logits within 2e-2."""
    build_tiny_model(arch, tmp_path)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).cuda().eval()
    reference.generation_config.eos_token_id = None
    eng = engine(tmp_path, **{"model.dtype": "bfloat16"})
    try:
        batch = prompts(reference.config.vocab_size)
        ours = eng.generate(batch, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
        for prompt, completion in zip(batch, ours, strict=True):
            expected = hf_greedy(reference, prompt, 32)
            full = prompt + expected
            with torch.no_grad():
                ref_logits = reference(torch.tensor([full], device="cuda")).logits[0].float()
            ref_logits = ref_logits[len(prompt) - 1 : -1]
            our_choice = prefill_logits(eng, full)[len(prompt) - 1 : -1].argmax(-1).tolist()
            top2 = ref_logits.topk(2).values
            near_tie = ((top2[:, 0] - top2[:, 1]) <= NEAR_TIE * top2[:, 0].abs()).tolist()
            assert all(
                a == b or tie for a, b, tie in zip(our_choice, expected, near_tie, strict=True)
            )
            first_tie = near_tie.index(True) if True in near_tie else len(expected)
            assert completion.token_ids[:first_tie] == expected[:first_tie]
        with torch.no_grad():
            expected_logits = reference(torch.tensor([batch[-1]], device="cuda")).logits[0].float()
        got = prefill_logits(eng, batch[-1])
        # MoE: transformers sums each token's experts in bfloat16 (index_add_ into a bfloat16
        # tensor) where ours sum in float32, and a near tie between two experts' router scores
        # can send a token to the other: 3.4e-2 measured for the tiny MoE models.
        tolerance = 5e-2 if arch.endswith("_moe") else 2e-2
        assert ((got - expected_logits).norm() / expected_logits.norm()).item() <= tolerance
    finally:
        eng.close()


def test_logprobs_on_the_gpu_match_transformers_in_float32(tmp_path) -> None:
    """Sampled-token logprobs (decode steps through the CUDA graphs) and prompt logprobs (the
    eager path), against transformers' log-softmax of the same logits."""
    build_tiny_model("llama", tmp_path, logit_scale=4.0)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).cuda().eval()
    eng = engine(tmp_path, **{"model.dtype": "float32"})
    params = SamplingParams(
        temperature=0.8, seed=3, max_tokens=16, ignore_eos=True, logprobs=5, prompt_logprobs=5
    )
    try:
        assert eng.executor.runner.graphs is not None
        batch = prompts(reference.config.vocab_size)
        for prompt, completion in zip(batch, eng.generate(batch, params), strict=True):
            full = prompt + completion.token_ids
            with torch.no_grad():
                logits = reference(torch.tensor([full], device="cuda")).logits[0].float()
            expected = torch.log_softmax(logits / 0.8, dim=-1).cpu()
            for i, entry in enumerate(completion.logprobs):
                assert_entry_matches(entry, expected[len(prompt) - 1 + i], full[len(prompt) + i], 5)
            for j, entry in enumerate(completion.prompt_logprobs):
                assert_entry_matches(entry, expected[j], prompt[j + 1], 5)
    finally:
        eng.close()


def test_cuda_graphs_equal_eager(tmp_path) -> None:
    build_tiny_model("llama", tmp_path)
    batch = prompts(384) * 3  # 12 requests: graphs pad them to 16
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for graphs in (True, False):
        eng = engine(tmp_path, **{"model.dtype": "float32", "device.cuda_graphs": graphs})
        try:
            assert (eng.executor.runner.graphs is not None) == graphs
            outputs[graphs] = [c.token_ids for c in eng.generate(batch, params)]
        finally:
            eng.close()
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize(
    "setting",
    [
        {"device.decode_attention_warps": 8},
        {"device.decode_attention_stages": 5},
        {"device.decode_attention_tile": 128},
        {"device.decode_attention_tile_128_from_programs": 8},  # the larger steps only
    ],
)
def test_other_decode_attention_builds_keep_the_tokens_through_graphs(tmp_path, setting) -> None:
    """A decode attention build other than the default (8 warps, two key tiles buffered, keys in
    tiles of 128 in every step or from 8 programs): the same greedy tokens as the defaults,
    float32, through the graphs (batch 1 splits the context most) and eager steps (12
    requests)."""
    from aioworker.compute.layers.attention.triton_decode import DecodeBuild

    build_tiny_model("qwen3", tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = []
    for settings in ({}, setting):
        eng = engine(tmp_path, **{"model.dtype": "float32", **settings})
        try:
            runner = eng.executor.runner
            build = runner.backend.decode_build_for(12, runner.num_kv_heads)
            assert (build != DecodeBuild()) == bool(settings)
            outputs.append(
                [
                    [c.token_ids for c in eng.generate(batch, params)]
                    for batch in (prompts(384)[:1], prompts(384) * 3)
                ]
            )
        finally:
            eng.close()
    assert outputs[1] == outputs[0]


def test_prefix_caching_and_samples_equal_caching_off_with_graphs(tmp_path) -> None:
    """Shared prefixes, a prompt that is a prefix of another, and n=4 samples: the same tokens
    with the cache on as off, through CUDA graphs and the decode kernel, float32."""
    build_tiny_model("qwen3", tmp_path)
    shared = prompts(384)[3][:160]  # 10 blocks
    batch = [shared + tail for tail in prompts(384)[:3]] + [shared[:100], shared]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True, n=4)
    outputs, hits = {}, {}
    for cached in (True, False):
        eng = engine(tmp_path, **{"model.dtype": "float32", "cache.enable_prefix_caching": cached})
        try:
            assert eng.executor.runner.graphs is not None
            first = [c.token_ids for c in eng.generate(batch[:1], greedy)]
            rest = [c.token_ids for c in eng.generate(batch[1:], greedy)]
            samples = [c.token_ids for c in eng.generate([batch[0]], sampled)]
            # the one-pass sampling kernel: sample i equals a request seeded seed + i
            alone = [msgspec.structs.replace(sampled, n=1, seed=3 + i) for i in range(4)]
            assert samples == [c.token_ids for c in eng.generate([batch[0]] * 4, alone)]
            outputs[cached] = (first + rest, samples)
            hits[cached] = eng.block_manager.num_hit_tokens
        finally:
            eng.close()
    assert outputs[True] == outputs[False]
    assert hits[True] > 0 and hits[False] == 0


def test_xformers_decode_agrees_with_ours(tmp_path) -> None:
    pytest.importorskip("xformers")
    build_tiny_model("qwen3", tmp_path)
    batch = prompts(384)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outputs = {}
    for backend in ("triton", "xformers"):
        eng = engine(
            tmp_path,
            **{
                "model.dtype": "bfloat16",
                "cache.block_size": 64,
                "cache.num_blocks": 128,
                "device.attention_backend": backend,
            },
        )
        try:
            outputs[backend] = [c.token_ids for c in eng.generate(batch, params)]
        finally:
            eng.close()
    agreeing = sum(a == b for a, b in zip(outputs["triton"], outputs["xformers"], strict=True))
    assert agreeing >= len(batch) - 1, outputs


def test_profiled_cache_keeps_the_process_inside_its_budget() -> None:
    from aioworker.bench.gpu import QWEN3_06B

    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    eng = engine(
        QWEN3_06B,
        **{
            "model.load_format": "dummy",
            "model.dtype": "bfloat16",
            "cache.num_blocks": 0,
            "cache.gpu_memory_utilization": 0.5,
            "model.max_model_len": 4096,
            "scheduler.max_num_batched_tokens": 8192,
        },
    )
    try:
        # The largest prefill the scheduler may run, then decoding, then the memory check.
        rng = np.random.default_rng(0)
        requests = [rng.integers(0, 10000, 4000).tolist() for _ in range(4)]
        eng.generate(
            requests, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=8, ignore_eos=True)
        )
        free_after, _ = torch.cuda.mem_get_info()
        used_by_process = (total - free_after) - (total - free_before)
        assert (
            eng.loaded.num_blocks * eng.loaded.block_size > 100_000
        )  # a real cache, not a token one
        assert (total - free_after) <= 0.5 * total, (used_by_process, total)
    finally:
        eng.close()


def test_zmq_process_path_serves_256_concurrent_requests(tmp_path) -> None:
    from aioworker.wire.client import Client
    from tests.workers import deployment, running

    build_tiny_model("qwen3", tmp_path)
    config, set_args = deployment(
        **{
            "model.path": str(tmp_path),
            "device.kind": "cuda",
            "cache.num_blocks": 4096,
            "model.max_model_len": 1024,
        }
    )

    async def scenario():
        async with Client.from_config(config) as client:
            batch = [prompts(384)[i % 4] for i in range(256)]
            params = SamplingParams(temperature=0.8, max_tokens=32, ignore_eos=True)
            completions = await asyncio.gather(*(client.generate(p, params) for p in batch))
            await asyncio.sleep(0.2)
            return completions, client.num_unexpected_outputs

    with running(config, set_args):
        completions, unexpected = asyncio.run(scenario())
    assert [c.finish_reason for c in completions] == ["length"] * 256
    assert all(len(c.token_ids) == 32 for c in completions) and unexpected == 0


def test_release_frees_90_percent_and_resume_serves_the_same_tokens() -> None:
    from aioworker.bench.gpu import QWEN3_06B

    eng = engine(
        QWEN3_06B,
        **{
            "model.load_format": "dummy",
            "model.dtype": "bfloat16",
            "cache.num_blocks": 20000,
            "model.max_model_len": 4096,
        },
    )
    try:
        batch = prompts(10000)
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        before = [c.token_ids for c in eng.generate(batch, params)]
        runner = eng.executor.runner
        weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
        layers = runner.model.attention_layers()
        cache_bytes = sum(
            2 * layer.k_cache.numel() * layer.k_cache.element_size() for layer in layers
        )
        memory = eng.executor.weights.memory
        freed = eng.executor.call(lambda: memory.release(True, True)).result()
        assert freed >= 0.9 * (weight_bytes + cache_bytes), (freed, weight_bytes, cache_bytes)
        eng.executor.call(memory.resume).result()
        eng.core.reset_prefix_cache()  # as the runtime's release-memory does: the KV is gone
        assert runner.graphs is not None  # re-captured
        after = [c.token_ids for c in eng.generate(batch, params)]
        assert after == before
    finally:
        eng.close()


def test_an_ipc_update_from_a_second_process_is_picked_up(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from tests.workers import admin, deployment, running

    build_tiny_model("qwen3", tmp_path / "old", seed=0)
    build_tiny_model("qwen3", tmp_path / "new", seed=1)
    # float32: the probe's batching differs between the two runs, and bf16 near-ties could flip.
    fresh = engine(tmp_path / "new", **{"model.dtype": "float32"})
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    try:
        expected = [c.token_ids for c in fresh.generate(prompts(384), params)]
    finally:
        fresh.close()
    overrides = {"model.path": str(tmp_path / "old"), "model.dtype": "float32", **GPU}
    config, set_args = deployment(**overrides)

    async def probe():
        from aioworker.wire.client import Client

        async with Client.from_config(config) as client:
            return [(await client.generate(p, params)).token_ids for p in prompts(384)]

    with running(config, set_args):
        trainer = subprocess.run(
            [sys.executable, "-m", "tests.ipc_trainer", str(tmp_path / "new"), config.runtime.name],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        reply = json.loads(trainer.stdout.strip().splitlines()[-1])
        status = admin(config, "status").data
        after = asyncio.run(probe())
    assert reply["ok"], (reply, trainer.stderr[-2000:])
    assert status["weights_version"] == 7
    assert after == expected


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (kind nvidia-h200-x2)")
def test_tp2_over_nccl_equals_tp1_in_float32(tmp_path) -> None:
    """Two ranks on two GPUs, NCCL collectives and the rendezvous on the group's host alone:
    the same greedy tokens as one rank."""
    from aioworker.wire.client import Client
    from tests.conftest import make_engine
    from tests.workers import deployment, running

    build_tiny_model("qwen3", tmp_path, logit_scale=4.0)
    settings = {
        "model.path": str(tmp_path),
        "model.dtype": "float32",
        "device.kind": "cuda",
        "cache.num_blocks": 512,
        "model.max_model_len": 512,
    }
    batch = prompts(384)
    params = SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5, prompt_logprobs=5
    )
    engine = make_engine(tmp_path, **settings)
    try:
        expected = engine.generate(batch, params)
    finally:
        engine.close()
    config, set_args = deployment(**settings, **{"parallel.tensor_parallel_size": 2})

    async def scenario():
        async with Client.from_config(config) as client:
            return await asyncio.gather(*(client.generate(p, params) for p in batch))

    with running(config, set_args):
        completions = asyncio.run(scenario())
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    for ours, theirs in zip(completions, expected, strict=True):
        assert_logprobs_close(ours.logprobs, theirs.logprobs)
        assert_logprobs_close(ours.prompt_logprobs, theirs.prompt_logprobs)


class ReplayDrafts:
    """Each prompt's own greedy continuation as its drafts: the target as its own draft."""

    def __init__(self, runs: list[list[int]]) -> None:
        self.runs = runs

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        for run in self.runs:
            if run[: len(token_ids)] == token_ids:
                return run[len(token_ids) : len(token_ids) + max_tokens]
        return []


def test_speculation_verifies_through_the_paged_kernel_and_keeps_the_tokens(
    tmp_path, monkeypatch
) -> None:
    from aioworker.compute.layers.attention import cuda_backend

    build_tiny_model("llama", tmp_path)
    batch = prompts(384)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, seed=9, max_tokens=16, ignore_eos=True, n=2)
    plain = engine(tmp_path, **{"model.dtype": "float32"})
    try:
        expected = [c.token_ids for c in plain.generate(batch, greedy)]
    finally:
        plain.close()
    calls = []
    kernel = cuda_backend.paged_decode
    monkeypatch.setattr(
        cuda_backend,
        "paged_decode",
        lambda *args, **kw: calls.append(kw.get("queries")) or kernel(*args, **kw),
    )
    speculative = {"speculative.method": "ngram", "speculative.dynamic": False}
    eng = engine(tmp_path, **{"model.dtype": "float32", **speculative})
    try:
        ngram = [c.token_ids for c in eng.generate(batch, greedy)]
        speculator = eng.scheduler.speculator
        speculator.proposer = ReplayDrafts([p + e for p, e in zip(batch, expected, strict=True)])
        proposed, accepted = speculator.policy.num_proposed, speculator.policy.num_accepted
        replayed = [c.token_ids for c in eng.generate(batch, greedy)]
        proposed = speculator.policy.num_proposed - proposed
        accepted = speculator.policy.num_accepted - accepted
        samples = [[c.token_ids for c in eng.generate(batch[:2], seeded)] for _ in range(2)]
        verify_graph_runs = eng.executor.runner.verify_graphs.num_runs
    finally:
        eng.close()
    assert verify_graph_runs > 0
    assert ngram == expected and replayed == expected
    assert proposed > 0 and accepted / proposed >= 0.99
    assert samples[0] == samples[1]
    assert any(queries is not None and queries[2] == 5 for queries in calls)


@pytest.mark.parametrize("draft", ["self", "separate"])
def test_drafts_from_a_model_keep_the_greedy_tokens(tmp_path, draft: str) -> None:
    """Drafts made on the device after each step, in the draft graphs for small batches and
    eagerly past them (the capture size is 4); a separate draft equal to the target catches
    its cache up every step, so nearly all its drafts are accepted."""
    build_tiny_model("llama", tmp_path)
    batch = prompts(384)
    many = batch * 3  # past the graphs
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    small = {"model.dtype": "float32", "device.max_capture_batch_size": 4}
    plain = engine(tmp_path, **small)
    try:
        expected = [[c.token_ids for c in plain.generate(b, greedy)] for b in (batch[:3], many)]
    finally:
        plain.close()
    speculative = {"speculative.method": "draft", "speculative.dynamic": False}
    if draft == "self":
        speculative["speculative.draft_layers"] = 1
    else:
        speculative["speculative.model"] = str(tmp_path)
    eng = engine(tmp_path, **small, **speculative)
    try:
        got = [[c.token_ids for c in eng.generate(b, greedy)] for b in (batch[:3], many)]
        policy = eng.scheduler.speculator.policy
        graphs = eng.executor.runner.draft_graphs
        draft_graph_runs = graphs.num_runs + graphs.num_device_runs
    finally:
        eng.close()
    assert got == expected
    assert draft_graph_runs > 0 and policy.num_proposed > 0
    if draft == "separate":
        assert policy.num_accepted / policy.num_proposed >= 0.99
