"""A decoder layer's residual add and RMSNorm computed inside the product that reads them (its
qkv and gate/up products), so that they launch no kernel of their own and the normed row never
goes through memory.

RMSNorm scales the row h = x + residual by 1 / rms(h), which needs all of h, while a program sees
only its slice of K. That scale factors out of the product, as a per-channel scale does:

    sum_k W[c, k] (h_k / rms(h)) n_k  =  (1 / rms(h)) sum_k W[c, k] (h_k n_k)

so a program multiplies W by h n, adds up h^2 over its slice on the way, and scales its sums
once at the end (with split K, each slice's sum of squares goes with its partial sums). h is
rounded to the activation dtype as the unfused add rounds it, and written out once (by the first
tile's programs) for the next residual add; h n is rounded to the activation dtype, as the tensor
cores take it. The unfused kernel rounds h / rms(h) before multiplying by n: the two differ by
that one rounding per element (none in float32).

fp16 activations are not fused: h n, unscaled, can leave fp16's range where the normed row would
not. bf16 and float32 share float32's range.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def normed_values(
    x_ptr, residual_ptr, norm_weight_ptr, residual_out_ptr, at, ks, mask, k_mask, write_sum,
    NORMED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """x at offsets `at` (K indices `ks`), or with NORMED (h n, h^2) there, h = x + residual
    (x where there is no residual), written to residual_out where `write_sum`. x, residual and
    residual_out are laid out alike. Returns (the product's input, the squares: x itself when
    not NORMED, for the caller to ignore)."""
    x = tl.load(x_ptr + at, mask=mask, other=0.0)
    squares = x
    if NORMED:
        if HAS_RESIDUAL:
            r = tl.load(residual_ptr + at, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as torch's add
            tl.store(residual_out_ptr + at, x, mask=tl.where(write_sum, mask, False))
        h = x.to(tl.float32)
        squares = h * h
        n = tl.load(norm_weight_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)
        x = (h * n).to(x.dtype)
    return x, squares


@triton.jit
def inverse_rms(squares_sum, depth, eps):
    """1 / rms of each row from its sum of squares over all of K."""
    return tl.rsqrt(squares_sum / depth + eps)
