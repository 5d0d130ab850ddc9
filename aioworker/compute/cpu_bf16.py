"""Whether this processor computes bfloat16 natively: AMX tiles or AVX512-BF16 dot products,
which oneDNN's bf16 GEMMs use. Elsewhere bf16 is converted to float32 for every product and is
slower than float32 itself. What model.dtype "auto" picks on the CPU (build_rank.pick_dtype):
on the 2-core EPYC (avx512_bf16), bf16 decodes the embedded model 1.51x as fast as float32 at
batch 1 and 1.47x at 16 (docs/benchmarks.md, 2026-12-02)."""

from __future__ import annotations

from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def computes_bf16_natively(flags: set[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return "avx512_bf16" in flags or "amx_bf16" in flags
