"""The Triton compiles a timed run paid (bench/triton_compiles.py): Triton's JIT hooks are ours
while attached and Triton's own again after; each compile is timed in its own thread. The CPU
compiles no kernel (the interpreter runs them), so the hooks are called as Triton calls them."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

knobs = pytest.importorskip("triton").knobs  # interpreted without a GPU (tests/conftest.py)

from aioworker.bench.triton_compiles import TritonCompiles  # noqa: E402


def _compile(name: str, seconds: float) -> None:
    """What Triton's JITFunction does on a compile: both hooks, by keyword, around the work."""
    fn = SimpleNamespace(name=name, module="m")
    assert not knobs.runtime.jit_cache_hook(key=(), repr="", fn=fn, compile={},
                                            is_manual_warmup=False, already_compiled=False)  # fmt: skip
    time.sleep(seconds)
    knobs.runtime.jit_post_compile_hook(key=(), repr="", fn=fn, compile={}, is_manual_warmup=False,
                                        already_compiled=False)  # fmt: skip


def test_compiles_are_counted_and_timed_while_attached_only() -> None:
    before = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    with TritonCompiles() as compiles:
        slow = threading.Thread(target=_compile, args=("_decode_partial", 0.05))
        slow.start()
        _compile("_add_rms_norm_kernel", 0.0)  # while the other thread compiles
        slow.join()
        _compile("_add_rms_norm_kernel", 0.0)
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == before
    names = [name for name, _ in compiles.compiled]
    assert sorted(names) == ["_add_rms_norm_kernel", "_add_rms_norm_kernel", "_decode_partial"]
    seconds = dict(reversed(compiles.compiled))
    assert seconds["_decode_partial"] >= 0.05 > seconds["_add_rms_norm_kernel"]
    summary = compiles.summary()
    assert summary.startswith("Triton compiled 3 kernels in 0.")
    assert "_add_rms_norm_kernel x2" in summary and "_decode_partial" in summary


def test_a_run_that_compiled_nothing_says_so() -> None:
    with TritonCompiles() as compiles:
        pass
    assert compiles.summary() == "no Triton kernel compiled"


def test_a_process_without_triton_is_left_without_it() -> None:
    """Importing Triton decides how its own kernels are built (interpreted or compiled), so a
    timeline attached in a process that has not imported it must not import it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from aioworker.bench.triton_compiles import TritonCompiles\n"
        "with TritonCompiles() as compiles:\n"
        "    pass\n"
        "assert 'triton' not in sys.modules, 'imported'\n"
        "print(compiles.summary())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no Triton kernel compiled"
