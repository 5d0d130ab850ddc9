"""The engine core, one for the offline engine and the driver: requests in (add, abort), steps
launched ahead on the executor, outputs back.

Up to MAX_IN_FLIGHT steps are in flight: while one runs on the device, the next is already
scheduled and queued behind it, so the device never waits for the host between steps. The
offline engine waits for the oldest step by blocking; the driver awaits it on its event loop.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import msgspec

from aioworker.config import SchedulerOptions
from aioworker.core.admission import QueueFull, RequestValidator
from aioworker.core.block_manager import BlockManager
from aioworker.core.executor import Executor
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence
from aioworker.core.stop_string_ends import StopStringEnds

# Steps launched ahead: one running, one queued behind it on the device.
MAX_IN_FLIGHT = 2


@dataclass(slots=True)
class InFlightStep:
    plan: StepPlan
    future: Future[StepResult]
    submitted_at: float  # time.monotonic()


class EngineCore:
    def __init__(
        self,
        executor: Executor,
        loaded: LoadedRank,
        options: SchedulerOptions,
        num_blocks: int | None = None,
        enable_prefix_caching: bool = False,
    ) -> None:
        """`num_blocks` overrides the rank's own count (tensor parallelism: the smallest rank's)."""
        self.executor = executor
        self.validator = RequestValidator(loaded.vocab_size, loaded.max_model_len)
        self.eos_token_ids = loaded.eos_token_ids
        self.max_waiting = options.max_waiting
        self.stop_ends = StopStringEnds(loaded.tokenizer)
        blocks = BlockManager(
            num_blocks or loaded.num_blocks, loaded.block_size, enable_prefix_caching
        )
        self.scheduler = Scheduler(
            blocks,
            options.max_num_seqs,
            options.step_token_budget(loaded.device),
            loaded.max_model_len,
        )
        self.in_flight: collections.deque[InFlightStep] = collections.deque()
        # Stamped on every output: which weights produced it.
        self.weights_version = 0
        self.last_step_id = -1  # of the newest completed step
        self._seq_ids = itertools.count()

    # -- requests -----------------------------------------------------------------------------

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidRequestError naming the bad field and its limit, or
        QueueFull."""
        if request_id in self.scheduler.seqs_by_request:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use")
        self.validator.check(prompt_token_ids, params)
        self.stop_ends.check(params.stop)
        if len(self.scheduler.waiting) >= self.max_waiting:
            raise QueueFull(
                f"{len(self.scheduler.waiting)} requests are waiting already "
                f"(scheduler.max_waiting); retry later or on another group"
            )
        samples = [self._sample(request_id, prompt_token_ids, params, i) for i in range(params.n)]
        self.scheduler.add(samples[0], samples[1:])
        for index in range(params.n):
            self.stop_ends.add(request_id, index, params.stop)

    def _sample(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, index: int
    ) -> Sequence:
        """Sample `index` of a request: its own sequence, seeded seed + index."""
        if index and params.seed is not None:
            params = msgspec.structs.replace(params, seed=params.seed + index)
        seq = Sequence(
            next(self._seq_ids), request_id, prompt_token_ids, params, self.eos_token_ids
        )
        seq.sample_index = index
        return seq

    def abort(self, request_id: str) -> bool:
        """End a request now and free its KV blocks; False if it is unknown or already ended.
        Tokens of steps still in flight for it are dropped when they arrive."""
        self.stop_ends.discard(request_id)
        samples = list(self.scheduler.seqs_by_request.get(request_id, ()))
        for seq in samples:
            self.scheduler.abort(seq.seq_id)
        return bool(samples)

    def terminal_output(
        self,
        request_id: str,
        reason: FinishReason,
        error: str | None = None,
        error_kind: ErrorKind | None = None,
        sample_index: int = 0,
    ) -> RequestOutput:
        """The terminal output of a request (or one of its samples) that ends outside a step
        (aborted, refused)."""
        if reason is FinishReason.ERROR and error_kind is None:
            error_kind = ErrorKind.INTERNAL
        return RequestOutput(
            request_id,
            [],
            reason,
            error,
            self.current_step_id,
            self.weights_version,
            error_kind=error_kind,
            sample_index=sample_index,
        )

    @property
    def current_step_id(self) -> int:
        """The step running now (the oldest in flight), else the last one completed."""
        return self.in_flight[0].plan.step_id if self.in_flight else self.last_step_id

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.block_manager

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (new weights, released memory, an operator asked); returns
        how many. KV computed before never serves a request admitted after."""
        return self.block_manager.reset_prefix_cache()

    # -- steps --------------------------------------------------------------------------------

    def launch(self, before_submit: Callable[[StepPlan], None] | None = None) -> None:
        """Schedule and submit steps until MAX_IN_FLIGHT are in flight or nothing can run.
        `before_submit` sees each plan first (the driver publishes it to its peers)."""
        while len(self.in_flight) < MAX_IN_FLIGHT:
            plan = self.scheduler.schedule()
            if plan is None:
                return
            if before_submit is not None:
                before_submit(plan)
            future = self.executor.submit(plan)
            self.in_flight.append(InFlightStep(plan, future, time.monotonic()))

    def complete(self, result: StepResult) -> list[RequestOutput]:
        """The oldest step's result: tokens appended, finished requests ended; its outputs."""
        step = self.in_flight.popleft()
        self.last_step_id = step.plan.step_id
        outputs = self.scheduler.update(step.plan, result, self.weights_version)
        if self.stop_ends:
            outputs = self.stop_ends.apply(outputs, self.scheduler.stop_request)
        return outputs

    def step(self) -> list[RequestOutput]:
        """Blocking: launch what can run, wait for the oldest step and return its outputs."""
        self.launch()
        if not self.in_flight:
            return []
        return self.complete(self.in_flight[0].future.result())
