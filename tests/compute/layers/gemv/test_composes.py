"""The small-rows kernels compose with what decodes through them: n seeded samples, logprobs,
prefix caching, recompute preemption and n-gram speculation (whose verify steps multiply k + 1
rows a sequence through the kernels) give the tokens and logprobs of the same engine without
the kernels (tiny Llama, float32, CPU under Triton's interpreter). The kernels run with the
residual add and norm fused in (device.fused_norm_products) and split between the products
around them (device.norms_in_product_finish), the superset of their paths."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from aioworker.compute.layers.gemv import product  # noqa: E402
from aioworker.core.sampling_params import SamplingParams  # noqa: E402
from tests.conftest import make_engine  # noqa: E402
from tests.tiny_models import build_tiny_model  # noqa: E402

SETTINGS = {
    "model.max_model_len": 128,
    "device.cpu_packed_weights": False,
    "cache.num_blocks": 10,  # too few for every request at once: some are preempted
    "speculative.method": "ngram",
    "speculative.dynamic": False,
}


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(4)
    repeated = [rng.randrange(384) for _ in range(12)] * 4  # drafts for the n-gram drafter
    prompts = [repeated, repeated[:30], [rng.randrange(384) for _ in range(40)], repeated]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=7, n=3, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.0, logprobs=3, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),  # a cached prefix
    ]
    return prompts, params


def served(model_dir, kernels: bool) -> tuple[list, tuple[int, int]]:
    switches = {
        "device.small_batch_kernels": kernels,
        "device.fused_norm_products": kernels,
        "device.norms_in_product_finish": kernels,
    }
    engine = make_engine(model_dir, **SETTINGS, **switches)
    try:
        prompts, params = workload()
        outputs = [
            (c.token_ids, [(e.logprob, e.top_token_ids) for e in c.logprobs or []])
            for c in engine.generate(prompts, params)
        ]
        scheduler = engine.scheduler
        return outputs, (scheduler.speculator.policy.num_accepted, scheduler.num_preemptions)
    finally:
        engine.close()


def test_samples_logprobs_preemption_and_speculation_equal_the_kernels_off(
    tmp_path, monkeypatch
) -> None:
    build_tiny_model("llama", tmp_path, logit_scale=4.0)
    want, _ = served(tmp_path, kernels=False)
    rows = []
    real = product.small_rows_product

    def counted(x, *args, **kwargs):
        rows.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(product, "small_rows_product", counted)
    got, (accepted, preemptions) = served(tmp_path, kernels=True)
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want, strict=True):
        assert tokens == want_tokens
        for (logprob, top), (want_logprob, want_top) in zip(logprobs, want_logprobs, strict=True):
            assert top == want_top and abs(logprob - want_logprob) < 1e-4
    assert accepted > 0 and preemptions > 0
    assert max(rows) > 1  # several rows at once: verify steps or a batch
