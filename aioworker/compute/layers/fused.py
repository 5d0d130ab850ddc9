"""Fused elementwise kernels for the GPU: each replaces a chain of small torch kernels (a decode
step of a 28-layer model launched about 1,400 kernels before these, 350 after).

Each kernel rounds where the unfused torch code rounds (to the activation dtype after every
op that Hugging Face runs in that dtype), so results match the reference bit for bit in most
elements. On the CPU the torch versions run instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioworker.compute.layers.gdc import wait_for_previous_kernel
from aioworker.compute.layers.pdl import launch_options


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_r, stride_o, stride_ro, num_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as torch's add rounds
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / num_cols
    normed = (x32 * tl.rsqrt(variance + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(x.dtype), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); with no residual, (rms_norm(x), x). x: [T, D]."""
    num_rows, num_cols = x.shape
    out = torch.empty_like(x)
    residual_out = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x
    options = launch_options()
    _add_rms_norm_kernel[(num_rows,)](
        x, r, weight, out, residual_out,
        x.stride(0), r.stride(0), out.stride(0), residual_out.stride(0), num_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(num_cols),
        PDL=bool(options), **options,
    )  # fmt: skip
    return out, residual_out


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, width, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    activated = (g * tl.sigmoid(g)).to(gate.dtype).to(tl.float32)
    tl.store(
        out_ptr + row * stride_o + cols, (activated * up.to(tl.float32)).to(gate.dtype), mask=mask
    )


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate, up) -> silu(gate) * up: [T, I]."""
    num_rows, double_width = gate_up.shape
    width = double_width // 2
    out = torch.empty(num_rows, width, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    options = launch_options()
    _silu_and_mul_kernel[(num_rows, triton.cdiv(width, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), width, BLOCK=block, PDL=bool(options),
        **options,
    )  # fmt: skip
    return out


@triton.jit
def norm_rope_rows(
    row_ptrs, cos_ptrs, sin_ptrs, weight_ptr, eps, mask, HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Heads [R, D] whose values start at row_ptrs [R, 1]: optional RMSNorm (Qwen3), then
    rotary with each row's cos and sin (cos_ptrs, sin_ptrs [R, 1]: float32 rows of D); rows
    outside `mask` [R, 1] read as zeros. Returns the new values [R, D] in the heads' dtype."""
    half = HEAD_DIM // 2
    offs = tl.arange(0, HEAD_DIM)[None, :]
    partner_offs = (offs + half) % HEAD_DIM  # rotate_half pairs element i with i +- D/2
    x = tl.load(row_ptrs + offs, mask=mask, other=0.0)
    partner = tl.load(row_ptrs + partner_offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_NORM:  # the same scale for both halves
        x32 = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(x32 * x32, axis=1) / HEAD_DIM + eps)[:, None]
        w = tl.load(weight_ptr + offs).to(tl.float32)
        w_partner = tl.load(weight_ptr + partner_offs).to(tl.float32)
        x = ((x32 * inv_rms).to(dtype).to(tl.float32) * w).to(dtype)
        partner = ((partner.to(tl.float32) * inv_rms).to(dtype).to(tl.float32) * w_partner).to(
            dtype
        )
    rotated = tl.where(offs < half, -partner.to(tl.float32), partner.to(tl.float32))
    cos = tl.load(cos_ptrs + offs, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptrs + offs, mask=mask, other=0.0).to(dtype).to(tl.float32)
    a = (x.to(tl.float32) * cos).to(dtype).to(tl.float32)
    b = (rotated * sin).to(dtype).to(tl.float32)
    return (a + b).to(dtype)


@triton.jit
def _norm_rope_head(
    base, cos_ptr, sin_ptr, weight_ptr, token, stride_cos, eps,
    HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """One head of one token (`norm_rope_rows` for a single row): the new values [D]."""
    one = tl.zeros([1, 1], dtype=tl.int32)
    rows = norm_rope_rows(
        base + one, cos_ptr + token * stride_cos + one, sin_ptr + token * stride_cos + one,
        weight_ptr, eps, one == 0, HEAD_DIM, HAS_NORM,
    )  # fmt: skip
    return tl.reshape(rows, (HEAD_DIM,))


@triton.jit
def _norm_rope_kernel(
    x_ptr, cos_ptr, sin_ptr, weight_ptr,
    stride_token, stride_head, stride_cos, eps,
    HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0)
    base = x_ptr + token * stride_token + tl.program_id(1) * stride_head
    out = _norm_rope_head(
        base, cos_ptr, sin_ptr, weight_ptr, token, stride_cos, eps, HEAD_DIM, HAS_NORM
    )
    tl.store(base + tl.arange(0, HEAD_DIM), out)


def norm_rope_(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """In place on x: [T, H, D] (a strided view is fine): optional per-head RMSNorm, then rotary
    with cos, sin: [T, D] float32."""
    num_tokens, num_heads, head_dim = x.shape
    options = launch_options()
    _norm_rope_kernel[(num_tokens, num_heads)](
        x, cos, sin, weight if weight is not None else cos,
        x.stride(0), x.stride(1), cos.stride(0), eps,
        HEAD_DIM=head_dim, HAS_NORM=weight is not None, PDL=bool(options), **options,
    )  # fmt: skip
    return x


@triton.jit
def _qkv_rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_weight_ptr, k_weight_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_q, stride_k, stride_v, stride_cos, stride_slot, eps, num_q_heads, num_tokens,
    HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Programs (block of ROWS tokens, h): h < num_q_heads rotates a query head in place; the
    others rotate a key head in place and write it, with its value head, into the tokens'
    cache slots."""
    wait_for_previous_kernel(PDL)
    tokens = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    head = tl.program_id(1)
    offs = tl.arange(0, HEAD_DIM)[None, :]
    real = tokens < num_tokens
    cos_ptrs = cos_ptr + tokens * stride_cos
    sin_ptrs = sin_ptr + tokens * stride_cos
    if head < num_q_heads:
        rows = q_ptr + tokens * stride_q + head * HEAD_DIM
        out = norm_rope_rows(
            rows, cos_ptrs, sin_ptrs, q_weight_ptr, eps, real, HEAD_DIM, HAS_NORM
        )  # fmt: skip
        tl.store(rows + offs, out, mask=real)
    else:
        kv_head = head - num_q_heads
        rows = k_ptr + tokens * stride_k + kv_head * HEAD_DIM
        out = norm_rope_rows(
            rows, cos_ptrs, sin_ptrs, k_weight_ptr, eps, real, HEAD_DIM, HAS_NORM
        )  # fmt: skip
        tl.store(rows + offs, out, mask=real)
        slots = tl.load(slot_ptr + tokens, mask=real, other=0).to(tl.int64)
        cache_offs = slots * stride_slot + kv_head * HEAD_DIM + offs
        tl.store(k_cache_ptr + cache_offs, out, mask=real)
        v = tl.load(v_ptr + tokens * stride_v + kv_head * HEAD_DIM + offs, mask=real)
        tl.store(v_cache_ptr + cache_offs, v, mask=real)


# A program of one token moves 256 bytes a head, too few loads in flight once a step has
# dozens of tokens (295 us a layer for 15,680 tokens of Qwen3-0.6B on an H100). Four tokens a
# program beat one from 64 to 15,680 tokens (H100, 2026-12-07, docs/benchmarks.md): the fastest
# for Llama's heads everywhere and within 9% of 16 for Qwen3's, where 16 lost up to 30% on
# Llama's. Steps under 64 tokens keep one token a program, as small decode graphs captured it.
ROWS_FROM_TOKENS = 64
ROWS = 4


def rows_per_program(num_tokens: int) -> int:
    return ROWS if num_tokens >= ROWS_FROM_TOKENS else 1


def qkv_rope_cache_(
    q, k, v, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, slot_mapping, rows=None
) -> None:
    """Norm (optional) and rotary on q and k in place, and k, v into the cache, in one launch.
    q: [T, Hq, D], k, v: [T, Hkv, D] (strided views of the qkv output); caches contiguous.
    rows: tokens a program (a power of two), for tools/bench_rope_cache.py; None: by T."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    has_norm = q_weight is not None
    rows = rows_per_program(num_tokens) if rows is None else rows
    options = launch_options()
    _qkv_rope_cache_kernel[(triton.cdiv(num_tokens, rows), num_q_heads + num_kv_heads)](
        q, k, v, cos, sin, q_weight if has_norm else cos, k_weight if has_norm else cos,
        k_cache, v_cache, slot_mapping,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0), num_kv_heads * head_dim, eps,
        num_q_heads, num_tokens,
        HEAD_DIM=head_dim, HAS_NORM=has_norm, ROWS=rows, PDL=bool(options), **options,
    )  # fmt: skip
