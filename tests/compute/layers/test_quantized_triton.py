"""The quantized formats' Triton kernels against their torch versions (Triton's interpreter on a
CPU machine, small sizes; for real on the GPU machine, -m gpu too)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from aioworker.compute.layers.quantized import fp8, weight_only  # noqa: E402
from aioworker.compute.layers.quantized.triton_kernels import (  # noqa: E402
    fp8_quantize_rows,
    int4_dequantize,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.skipif(
    DEVICE == "cpu", reason="Triton's interpreter casts some values to e4m3 at half their value"
)
@pytest.mark.parametrize("shape", [(3, 256), (5, 200), (2, 128)])
def test_fp8_rows_quantize_as_torch_does(shape) -> None:
    x = torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16) * 3
    q, scales = fp8_quantize_rows(x)
    want_q, want_scales = fp8.quantize_rows(x.float())
    torch.testing.assert_close(scales, want_scales.to(DEVICE))
    # one e4m3 step at most where the two round a value on either side of a midpoint
    got, want = fp8.dequantize_rows(q, scales), fp8.dequantize_rows(want_q, want_scales)
    assert ((got - want).abs() <= want.abs() / 8 + scales[:, None] * 2**-9).all()
    assert (got == want).float().mean() > 0.98


@pytest.mark.parametrize("shape", [(16, 256), (19, 96)])
def test_int4_dequantizes_as_torch_does(shape) -> None:
    w = torch.randn(*shape)
    packed, scales, offsets = weight_only.quantize_int4_rows(w)
    want = weight_only.dequantize_int4_rows(packed, scales, offsets)
    got = int4_dequantize(packed.to(DEVICE), scales.to(DEVICE), offsets.to(DEVICE), torch.float32)
    torch.testing.assert_close(got.cpu(), want, rtol=2**-8, atol=1e-6)
