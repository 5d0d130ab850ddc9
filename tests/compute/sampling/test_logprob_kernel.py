"""The one-pass log-sum-exp and top-k kernel against torch. On a CPU machine it runs in Triton's
interpreter (small sizes); on the GPU machine, for real (-m gpu too)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from aioworker.compute.sampling.logprob_kernel import BLOCK, lse_and_top_k  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZES = [(BLOCK - 7, 5), (2 * BLOCK + 1, 20), (BLOCK, 1), (3 * BLOCK + 5, 0)]
if DEVICE == "cuda":
    SIZES.append((151936, 5))  # Qwen3's vocabulary


@pytest.mark.parametrize(("vocab", "k"), SIZES)
def test_lse_and_top_k_equal_torch(vocab: int, k: int) -> None:
    scaled = torch.randn(4, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    scaled[1, -1] = 50.0  # a row whose best token is the very last one
    scaled[2, : k + 3] = -1e30  # very unlikely tokens change nothing
    scaled = scaled.to(DEVICE)
    lse, values, ids = lse_and_top_k(scaled, k)
    expected_values, expected_ids = scaled.topk(k, dim=-1)
    assert torch.allclose(lse, torch.logsumexp(scaled, dim=-1), atol=1e-5, rtol=1e-6)
    assert torch.equal(values, expected_values) and torch.equal(ids, expected_ids)


def test_the_warm_up_compiles_each_padding_that_a_request_may_need(monkeypatch) -> None:
    """Every logprobs count a request may ask (0 to MAX_LOGPROBS) pads to a slot count the
    warm-up launched, so none compiles the kernel in service."""
    from aioworker.compute.sampling import logprob_kernel
    from aioworker.core.sampling_params import MAX_LOGPROBS

    launched = []
    monkeypatch.setattr(logprob_kernel, "lse_and_top_k", lambda x, k: launched.append(k))
    logprob_kernel.warm_up(64, torch.device("cpu"))
    warmed = {logprob_kernel.padded(k) for k in launched}
    assert {logprob_kernel.padded(k) for k in range(MAX_LOGPROBS + 1)} == warmed
    assert len(launched) == len(warmed) == 5 and max(launched) <= MAX_LOGPROBS
