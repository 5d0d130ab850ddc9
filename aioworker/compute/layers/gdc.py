"""What a kernel launched with programmatic dependent launch (pdl.py) does before it may touch
memory that an earlier kernel writes: wait for that kernel. Before the wait it may only read what
no kernel of the step writes, such as weights: `prefetch_to_l2` fetches them while it waits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: block until the kernel before this one has finished and its writes are
    visible, then let the next kernel's programs be placed (they wait likewise)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_to_l2(pointers):
    """Fetch the 128-byte lines at `pointers` into L2, without waiting for them (compiled for
    CUDA only: Triton's interpreter runs no PTX)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip
