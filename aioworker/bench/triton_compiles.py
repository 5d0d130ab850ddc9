"""Which Triton kernels a timed run compiled, and how long each took: a run that meets a kernel
or a specialization (an integer argument now 1, or divisible by 16) its process has not launched
before compiles it on the host in the middle of the run. W1's first run on a new engine is 6-20%
slower than the next ones (docs/benchmarks.md); this says how much of that is the compiler."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field


@dataclass
class TritonCompiles:
    """While attached (`with`), records (kernel name, seconds) for each kernel Triton compiled
    (or loaded from its disk cache: a process's first launch of a specialization), through
    Triton's JIT hooks. Where the process has not imported Triton, nothing can compile and this
    does not import it: Triton's own kernels are built interpreted or compiled by how
    TRITON_INTERPRET is set when it is first imported, which is not this module's to decide."""

    compiled: list[tuple[str, float]] = field(default_factory=list)
    _started: dict[int, float] = field(default_factory=dict)  # by thread: compiles are per thread
    _saved: tuple | None = None

    def __enter__(self) -> TritonCompiles:
        triton = sys.modules.get("triton")
        if triton is None:
            return self
        hooks = triton.knobs.runtime
        self._saved = (hooks, hooks.jit_cache_hook, hooks.jit_post_compile_hook)
        hooks.jit_cache_hook, hooks.jit_post_compile_hook = self.before, self.after
        return self

    def __exit__(self, *_) -> None:
        if self._saved is not None:
            hooks, before, after = self._saved
            hooks.jit_cache_hook, hooks.jit_post_compile_hook = before, after
            self._saved = None

    def before(self, **_) -> None:
        """Triton's jit_cache_hook: called before a compile. None: compile (a true value would
        make Triton skip it)."""
        self._started[threading.get_ident()] = time.perf_counter()

    def after(self, *, fn, **_) -> None:
        started = self._started.pop(threading.get_ident(), None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        self.compiled.append((fn.name, seconds))

    def summary(self) -> str:
        if not self.compiled:
            return "no Triton kernel compiled"
        seconds = sum(s for _, s in self.compiled)
        counts: dict[str, int] = {}
        for name, _ in self.compiled:
            counts[name] = counts.get(name, 0) + 1
        names = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.items())
        return f"Triton compiled {len(self.compiled)} kernels in {seconds:.2f} s ({names})"
