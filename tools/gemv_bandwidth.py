"""Weight-read bandwidth of the small-M product kernel (compute/layers/gemv/triton_gemv.py)
beside torch's (cuBLAS), on the Llama-3.1-8B projection shapes, for 1 and 8 rows; the device's
copy bandwidth measured in the same run. GPU only.

    python tools/gemv_bandwidth.py
"""

from __future__ import annotations

import torch
import triton

from aioworker.compute.layers.gemv.triton_gemv import gemv

SHAPES = {"qkv 6144x4096": (6144, 4096), "o 4096x4096": (4096, 4096),
          "gate_up 28672x4096": (28672, 4096), "down 4096x14336": (4096, 14336)}  # fmt: skip


def seconds(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100) / 1e3


def main() -> None:
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_rate = 2 * big.numel() / seconds(lambda: big.clone())
    print(f"copy bandwidth (read + write): {copy_rate / 1e12:.2f} TB/s")
    print("| shape | rows | torch TB/s | triton TB/s | triton of copy |")
    print("| --- | --- | --- | --- | --- |")
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for rows in (1, 8):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(gemv(x, weight), x @ weight.T, rtol=2e-2, atol=2e-1)
            nbytes = weight.numel() * 2
            theirs = nbytes / seconds(lambda: x @ weight.T)
            ours = nbytes / seconds(lambda: gemv(x, weight))
            print(f"| {name} | {rows} | {theirs / 1e12:.2f} | {ours / 1e12:.2f} | "
                  f"{ours / copy_rate:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
