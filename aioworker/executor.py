"""The executor thread: it owns the device, the model, the KV cache and (on a GPU) its own CUDA
stream. The asyncio loop and the offline engine meet it only through `submit(plan) -> Future`."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from aioworker.plan import StepPlan, StepResult

_STOP = object()


class Executor:
    def __init__(self, device: torch.device, name: str = "aioworker-executor") -> None:
        self.device = device
        self.runner = None  # set by `call(build)` on this thread
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, plan: StepPlan) -> Future[StepResult]:
        return self.call(lambda: self.runner.execute(plan))

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run any function on the executor thread (loading, profiling, the step itself)."""
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop after the jobs already queued; False if the thread is still busy after `timeout`."""
        self._jobs.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        stream = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while (job := self._jobs.get()) is not _STOP:
                fn, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:  # delivered to whoever awaits the future
                    future.set_exception(exc)
