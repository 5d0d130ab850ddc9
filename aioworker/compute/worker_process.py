"""How a worker process (`aioworker worker`, one rank) builds its compute: importing this module
sets the OpenMP wait policy before torch loads, and the rank builds with its share of the host's
CPU cores.

The policy: unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set already, GOMP_SPINCOUNT=10000.
libgomp (torch's OpenMP) otherwise spins idle threads 300,000 times (milliseconds) after each
parallel region, i.e. through much of the gap between steps, where the rank's asyncio loop (and
the other ranks of the host) need the cores. A short spin still bridges the regions of one step
(a passive policy, sleeping at once, cost a 2-thread rank 30% of its throughput; 10,000 cost
nothing measurable: docs/benchmarks.md), then sleeps. libgomp reads it once, when torch loads:
hence at import, here, before any module that imports torch. The offline engine keeps libgomp's
default: it has no loop to starve.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Spins before an idle OpenMP thread sleeps (libgomp's default: 300,000).
WORKER_SPIN_COUNT = "10000"

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = WORKER_SPIN_COUNT

from aioworker.compute import build_rank as _build_rank  # noqa: E402 - torch loads here

if TYPE_CHECKING:
    from aioworker.compute.executor_thread import ExecutorThread
    from aioworker.compute.parallel import TensorParallel
    from aioworker.config import WorkerConfig
    from aioworker.core.loaded_rank import LoadedRank


def build_rank(
    config: WorkerConfig, tp: TensorParallel, *, device_index: int, **options: Any
) -> tuple[ExecutorThread, LoadedRank]:
    """compute.build_rank.build_rank for the rank numbered `device_index` in the deployment (the
    worker's --rank): it picks the rank's GPU, sizes its share of the host's CPU cores, and reads
    the grammar vocabulary before it serves (XgrammarBackend.read_vocabulary says why)."""
    executor, loaded = _build_rank.build_rank(
        config, tp, device_index=device_index, global_rank=device_index, **options
    )
    if loaded.grammars is not None:
        loaded.grammars.read_vocabulary()
    return executor, loaded
