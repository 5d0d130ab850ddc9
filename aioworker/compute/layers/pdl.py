"""Programmatic dependent launch (Hopper and later), for the kernels of a decode step: each is
launched so that the GPU may start it while the kernel before it is still finishing, instead of
after that kernel has finished, drained and flushed. A decode step is a chain of a few hundred
short kernels, so those gaps add up.

The contract that keeps this correct: a kernel launched so waits for the kernel before it
(`wait_for_previous_kernel`, griddepcontrol.wait) before it reads or writes any memory, and
every kernel does so, so each waits, through the one before it, on all earlier ones. Kernels
not launched so (torch's, cuBLAS's) are ordered as usual.

device.pdl switches it for the rank's process (`enable`, at model load); each launch asks
`launch_options()`.
"""

from __future__ import annotations

_enabled = False


def enable(on: bool) -> None:
    global _enabled
    _enabled = on


def launch_options() -> dict[str, bool]:
    """Triton launch keywords: {"launch_pdl": True} where switched on, else none. Pass PDL=
    bool(options) to the kernel too, so that it waits."""
    return {"launch_pdl": True} if _enabled else {}
