"""The executor thread: it owns the device, the model, the KV cache and (on a GPU) its own CUDA
stream. The asyncio loop and the offline engine meet it only through the `Executor` Protocol of
core/: `submit(plan) -> Future`, `run_weights_phase(phase) -> Future`, `shutdown()`.

Steps are launched on the executor thread and completed on a second thread that waits for each
step's sampled tokens: so while step N runs on the GPU, step N+1 can already be launched behind
it, and the GPU never waits for the host between steps.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from aioworker.core.grammar import StepMasks
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.weights_phase import WeightsPhase

if TYPE_CHECKING:
    from aioworker.compute.layers.moe.load_meter import ExpertLoadMeter
    from aioworker.compute.step.runner import ModelRunner
    from aioworker.compute.step.stages import StepHandle
    from aioworker.compute.thread_governor import ThreadGovernor
    from aioworker.compute.weights.rank_weights import RankWeights

_STOP = object()


class ExecutorThread:
    """Satisfies core's `Executor` Protocol; `call(fn)` runs anything else on the thread."""

    def __init__(
        self,
        device: torch.device,
        name: str = "aioworker-executor",
        governor: ThreadGovernor | None = None,
    ) -> None:
        """`governor`: a CPU rank's thread count, tuned by timing its steps."""
        self.device = device
        self.governor = governor
        self.runner: ModelRunner | None = None  # both given by install()
        self.weights: RankWeights | None = None
        # MoE models: reads the expert load off the device between steps (set by build_rank).
        self.expert_meter: ExpertLoadMeter | None = None
        # The CUDA stream the thread runs steps on (None on the CPU).
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._launched: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._completer = threading.Thread(
            target=self._complete, name=f"{name}-completion", daemon=True
        )
        self._thread.start()
        self._completer.start()

    def install(self, runner: ModelRunner, weights: RankWeights) -> None:
        """Hand over what the thread runs steps and weights phases on, once they are built (by
        `call`, on this thread: device state is created where it is used)."""
        self.runner = runner
        self.weights = weights

    def uninstall(self) -> None:
        """Forget the runner and weights, so their memory can be freed once the thread has
        stopped (benchmarks build one engine after another in one process)."""
        self.runner = self.weights = None

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        future: Future = Future()
        self._jobs.put((None, plan, future))
        return future

    def provide_masks(self, masks: StepMasks) -> None:
        """A submitted step's grammar masks, from the engine core's thread: copied to the device
        and unpacked there, on this executor's stream (queued before the step's sampling, which
        waits for them), so that the executor thread is not the one doing it."""
        if self.stream is None:
            self.runner.receive_masks(masks)
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self.runner.receive_masks(masks)

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run any function on the executor thread (loading, profiling, weight updates)."""
        future: Future = Future()
        self._jobs.put((fn, None, future))
        return future

    def run_weights_phase(self, phase: WeightsPhase) -> Future[int]:
        """A weights update phase or a memory release / resume, in order after the steps already
        submitted; the future gives the bytes freed. KV copies in flight end first: a phase may
        free or rewrite the blocks they read and write."""

        def run() -> int:
            self.runner.kv_copies.wait_all()
            return self.weights.run_phase(phase)

        return self.call(run)

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop after the jobs already queued; False if a thread is still busy after `timeout`."""
        self._jobs.put(_STOP)
        if self.runner is not None:
            self.runner.masks.close()  # a step waiting for masks that will not come
        self._thread.join(timeout)
        self._completer.join(timeout)
        return not (self._thread.is_alive() or self._completer.is_alive())

    def _run(self) -> None:
        stream = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            stream = self.stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while (job := self._jobs.get()) is not _STOP:
                fn, plan, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if plan is not None:
                        self._launched.put((self._launch(plan), future))
                    else:
                        future.set_result(fn())
                except BaseException as exc:  # delivered to whoever awaits the future
                    future.set_exception(exc)
        self._launched.put(_STOP)

    def _launch(self, plan: StepPlan) -> StepHandle:
        if self.expert_meter is not None and not plan.is_empty:
            self.expert_meter.on_launch()
        if self.governor is None or plan.is_empty:
            return self.runner.launch(plan)
        # On the CPU a launched step has finished: its time is the step's.
        self.governor.before_step()
        started = time.perf_counter()
        handle = self.runner.launch(plan)
        self.governor.after_step(plan.num_tokens, time.perf_counter() - started)
        return handle

    def _complete(self) -> None:
        while (item := self._launched.get()) is not _STOP:
            step, future = item
            try:
                future.set_result(step.result())
            except BaseException as exc:
                future.set_exception(exc)
