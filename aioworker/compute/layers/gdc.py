"""The wait every kernel launched with programmatic dependent launch makes first (pdl.py)."""

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
