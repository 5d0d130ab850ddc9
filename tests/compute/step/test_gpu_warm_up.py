"""On the GPU: after a rank has warmed up, serving's eager steps (prefill chunks beside decodes,
prompts of a few tokens) compile no Triton kernel; without the eager warm-up the same requests
do. Each side runs in a fresh process, whose Triton has launched nothing yet. (Logprobs' kernel
is warmed by the sampler on both sides.)"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

pytestmark = pytest.mark.gpu

SERVING = {
    "device.kind": "cuda",
    "model.dtype": "bfloat16",
    "model.max_model_len": 1024,
    "cache.num_blocks": 512,
    "scheduler.max_num_seqs": 64,
    "scheduler.max_num_batched_tokens": 64,  # long prompts prefill in chunks beside decodes
}


def _compiled_in_service(model_dir: str, warm: bool, found) -> None:
    """Build an engine (with or without the eager warm-up), serve a few batches, and put the
    Triton kernels they compiled on `found`."""
    from aioworker.bench.triton_compiles import TritonCompiles
    from aioworker.compute.step import eager_warm_up
    from aioworker.config import load_config
    from aioworker.core.sampling_params import SamplingParams
    from aioworker.engine import LLMEngine

    if not warm:
        eager_warm_up.warm_steps = lambda *args, **kwargs: []
    config = load_config(overrides={"model.path": model_dir, **SERVING})
    engine = LLMEngine.from_config(config, progress=False)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 384, (n,), generator=generator).tolist() for n in (3, 40, 150)]
    try:
        with TritonCompiles() as compiles:
            greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
            engine.generate(prompts * 4, greedy)  # 12 requests: mixed steps, then decodes
            engine.generate([[5, 6, 7]], greedy)  # a prompt of three tokens, alone
            sampled = SamplingParams(temperature=0.8, seed=1, max_tokens=4, ignore_eos=True)
            engine.generate(prompts, sampled)
            scored = SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, ignore_eos=True)
            engine.generate(prompts[:1], scored)  # logprobs: each k pads to a warmed size
        found.put([name for name, _ in compiles.compiled])
    finally:
        engine.close()


def compiled_in_service(model_dir, warm: bool) -> list[str]:
    context = multiprocessing.get_context("spawn")
    found = context.Queue()
    process = context.Process(target=_compiled_in_service, args=(str(model_dir), warm, found))
    process.start()
    try:
        return found.get(timeout=300)
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()


@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "not_warmed"])
def test_serving_compiles_nothing_after_the_eager_warm_up(tmp_path, warm: bool) -> None:
    from tests.tiny_models import build_tiny_model

    build_tiny_model("qwen3", tmp_path)
    compiled = compiled_in_service(tmp_path, warm)
    if warm:
        assert compiled == []
    else:  # the control: the same requests on a rank that skipped it compile in service
        assert "_decode_partial" in compiled, compiled
