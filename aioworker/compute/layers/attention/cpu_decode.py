"""The CPU's paged decode attention kernel (cpu_decode.c): built once per machine with its own C
compiler, cached, and called through ctypes on the tensors' memory.

Gathering a decode batch's context out of the paged cache and multiplying it in torch moves
every key and value three times (read, write the copy, read it again), and at 16 sequences this
was a third of a bf16 decode step on the 2-core machine. The kernel reads each key and value
where it lies, once. It shares torch's OpenMP runtime (torch's own libgomp is already loaded
when the kernel's is looked up), so it runs on the threads the rank's step runs on.

Where no C compiler is found, or the build fails, `load()` returns None and the torch path runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from aioworker.checkpoint.source import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
# -fno-math-errno lets the compiler call the C library's vector expf in the softmax.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"]
# The kernel's limits (cpu_decode.c): head_dim a multiple of its 16-float vectors.
LANES = 16
MAX_HEAD_DIM = 256
MAX_GROUP = 32


class _Shape(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int64)
        for name in (
            "batch",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "num_blocks",
            "block_size",
            "max_blocks",
            "window",
        )
    ] + [("scale", ctypes.c_float)]


class PagedDecode:
    """decode(q, k_cache, v_cache, block_table, context_lens, scale, window) -> out [B, Hq, D]."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._entries = {
            torch.bfloat16: library.paged_decode_bf16,
            torch.float32: library.paged_decode_f32,
        }
        for entry in self._entries.values():
            entry.restype = ctypes.c_int
            entry.argtypes = [ctypes.POINTER(_Shape)] + [ctypes.c_void_p] * 6 + [ctypes.c_int64]

    def serves(self, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        return (
            dtype in self._entries
            and head_dim <= MAX_HEAD_DIM
            and head_dim % LANES == 0
            and num_heads // num_kv_heads <= MAX_GROUP
        )

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        context_lens: torch.Tensor,
        max_context: int,
        scale: float,
        window: int,
    ) -> torch.Tensor:
        # q: [B, Hq, D]; caches: [Hkv, num_blocks, block_size, D]; block_table: [B, max_blocks]
        # int64; context_lens: [B] int64 (positions 0 .. len - 1 are attended)
        q = q.contiguous()
        out = torch.empty_like(q)
        num_kv_heads, num_blocks, block_size, head_dim = k_cache.shape
        shape = _Shape(
            q.shape[0], q.shape[1], num_kv_heads, head_dim, num_blocks, block_size,
            block_table.shape[1], window, scale,
        )  # fmt: skip
        tensors = (q, k_cache, v_cache, block_table, context_lens, out)
        failed = self._entries[q.dtype](
            ctypes.byref(shape), *(t.data_ptr() for t in tensors), max_context
        )
        if failed:
            raise MemoryError("the CPU decode kernel could not allocate its scratch memory")
        return out


@cache
def load() -> PagedDecode | None:
    """The kernel for this machine, built on first use; None where it cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        log.info("no C compiler found: CPU decode attention runs in torch")
        return None
    try:
        return PagedDecode(ctypes.CDLL(str(_built(compiler))))
    except subprocess.CalledProcessError as exc:
        log.warning(
            "the CPU decode kernel did not compile (%s): attention runs in torch\n%s",
            exc,
            exc.stderr[-2000:],
        )
    except OSError as exc:
        log.warning("the CPU decode kernel could not be loaded (%s): attention runs in torch", exc)
    return None


def _built(compiler: str) -> Path:
    """The compiled library in the cache, keyed by the source, the flags, the compiler and this
    machine's processor (-march=native); compiled into a temporary file and renamed, so ranks
    that build it at once never load a half-written one."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS, _processor()]).encode()).hexdigest()[
        :24
    ]
    target = cache_dir() / "kernels" / f"cpu_decode-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm"],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(built, target)
    log.info("built the CPU decode kernel: %s", target)
    return target


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()
