"""The engine core, one for the offline engine and the driver: requests in (add, abort), steps
launched ahead on the executor, outputs back.

Up to MAX_IN_FLIGHT steps are in flight: while one runs on the device, the next is already
scheduled and queued behind it, so the device never waits for the host between steps. The
offline engine waits for the oldest step by blocking; the driver awaits it on its event loop.

Speculative decoding changes one thing: a sequence's drafts follow its last known token, so
while the policy wants drafts, and while a step with drafts runs, no step is scheduled ahead
(the run-ahead rule in docs/architecture.md). The policy pays for that lost overlap: it times
steps from one completion to the next, which includes the host's work between them.
"""

from __future__ import annotations

import collections
import itertools
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import msgspec

from aioworker.config import SchedulerOptions, SpeculativeOptions
from aioworker.core.admission import QueueFull, RequestValidator
from aioworker.core.block_manager import BlockManager
from aioworker.core.executor import Executor
from aioworker.core.grammar import MaskFiller, has_guided_rows
from aioworker.core.guided_requests import GuidedRequests
from aioworker.core.host_tier import HostKvConnector, PreemptionMode
from aioworker.core.kv_connector import KvConnector
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.outputs import ErrorKind, FinishReason, RequestOutput
from aioworker.core.plan import StepPlan, StepResult
from aioworker.core.plan_builder import logit_controls
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import Sequence
from aioworker.core.speculation.ngram import NgramProposer
from aioworker.core.speculation.policy import SpeculationPolicy
from aioworker.core.speculation.speculator import Speculator
from aioworker.core.stop_string_ends import StopStringEnds

# Steps launched ahead: one running, one queued behind it on the device.
MAX_IN_FLIGHT = 2
# A step submitted this long after the previous one completed found the engine idle, not busy.
_IDLE_GAP_S = 0.05


@dataclass(slots=True)
class InFlightStep:
    plan: StepPlan
    future: Future[StepResult]
    submitted_at: float  # time.monotonic()
    # It samples for a guided sequence: the executor waits for its masks (core/grammar.py).
    owes_masks: bool = False


class EngineCore:
    def __init__(
        self,
        executor: Executor,
        loaded: LoadedRank,
        options: SchedulerOptions,
        num_blocks: int | None = None,
        enable_prefix_caching: bool = False,
        speculative: SpeculativeOptions | None = None,
        fill_threads: int = 1,
        preemption: PreemptionMode = "auto",
    ) -> None:
        """`num_blocks` overrides the rank's own count (tensor parallelism: the smallest rank's).
        `fill_threads`: threads that fill a large step's grammar masks (guided.fill_threads).
        `preemption`: with a host KV tier (cache.preemption), whether preemption may swap."""
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
            _speculator(
                speculative, loaded.max_model_len, options.step_token_budget(loaded.device)
            ),
            _connector(loaded, preemption),
        )
        self.in_flight: collections.deque[InFlightStep] = collections.deque()
        self.guided = GuidedRequests(loaded.grammars, loaded.eos_token_ids)
        self.mask_filler = None
        if loaded.grammars is not None:
            self.mask_filler = MaskFiller(
                loaded.grammars.num_mask_words,
                executor.provide_masks,
                min(fill_threads, os.cpu_count() or 1),
            )
        # Stamped on every output: which weights produced it.
        self.weights_version = 0
        self.last_step_id = -1  # of the newest completed step
        self._seq_ids = itertools.count()
        self._last_completed_at = 0.0  # time.monotonic() of the newest completed step
        # Whether work was left when it completed (the host's time until the next submission
        # is then the engine's own, not idleness).
        self._busy_after_completion = False

    # -- requests -----------------------------------------------------------------------------

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidRequestError naming the bad field and its limit, or
        QueueFull."""
        if request_id in self.scheduler.seqs_by_request or request_id in self.guided:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use")
        self.validator.check(prompt_token_ids, params)
        self.stop_ends.check(params.stop)
        if len(self.scheduler.waiting) >= self.max_waiting:
            raise QueueFull(
                f"{len(self.scheduler.waiting)} requests are waiting already "
                f"(scheduler.max_waiting); retry later or on another group"
            )
        samples = [self._sample(request_id, prompt_token_ids, params, i) for i in range(params.n)]
        if params.guided is None or self.guided.start(samples):
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
        # Logit controls count and mask per step what a sequence has seen: no drafts there.
        seq.can_speculate = logit_controls(params) is None
        return seq

    def abort(self, request_id: str) -> bool:
        """End a request now and free its KV blocks; False if it is unknown or already ended.
        Tokens of steps still in flight for it are dropped when they arrive."""
        self.stop_ends.discard(request_id)
        if self.guided.drop(request_id):
            return True
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
        return self.scheduler.has_work or bool(self.guided)

    def take_refused(self) -> list[RequestOutput]:
        """Terminal outputs of requests whose grammar failed to compile since the last call."""
        return self.guided.take_refused(self.terminal_output)

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.block_manager

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (new weights, released memory, an operator asked), in both
        KV tiers; returns how many. KV computed before never serves a request admitted after."""
        self.scheduler.drop_loaded_kv()
        return self.block_manager.reset_prefix_cache() + self.scheduler.connector.reset()

    # -- steps --------------------------------------------------------------------------------

    def launch(self, before_submit: Callable[[StepPlan], None] | None = None) -> None:
        """Schedule and submit steps until MAX_IN_FLIGHT are in flight or nothing can run.
        `before_submit` sees each plan first (the driver publishes it to its peers)."""
        if self.guided:
            for seq in self.guided.take_compiled():
                self.scheduler.add(seq[0], seq[1:])
        while len(self.in_flight) < MAX_IN_FLIGHT:
            if self.in_flight and self._must_wait_for_result():
                return
            plan = self.scheduler.schedule()
            if plan is None:
                return
            if self.scheduler.speculator is not None and not self.in_flight:
                self._observe_host_gap()
            if before_submit is not None:
                before_submit(plan)
            owes_masks = self.scheduler.num_guided > 0 and has_guided_rows(
                plan, self.scheduler.seqs.get
            )
            future = self.executor.submit(plan)
            self.in_flight.append(InFlightStep(plan, future, time.monotonic(), owes_masks))
            if owes_masks and len(self.in_flight) == 1:
                self.mask_filler.fill(plan, self.scheduler.seqs.get)

    def complete(self, result: StepResult) -> list[RequestOutput]:
        """The oldest step's result: tokens appended, finished requests ended; its outputs."""
        step = self.in_flight.popleft()
        self.last_step_id = step.plan.step_id
        self._time_step(step)
        outputs = self.scheduler.update(step.plan, result, self.weights_version)
        if self.in_flight and self.in_flight[0].owes_masks:
            # The next step's earlier tokens are all known now: its masks can be filled.
            self.mask_filler.fill(self.in_flight[0].plan, self.scheduler.seqs.get)
        self._busy_after_completion = self.scheduler.has_work
        if self.stop_ends:
            outputs = self.stop_ends.apply(outputs, self.scheduler.stop_request)
        return outputs

    def close(self) -> None:
        """Stop the grammar threads (after the executor: a step may wait for its masks)."""
        if self.mask_filler is not None:
            self.mask_filler.shutdown()
            self.guided.backend.close()

    def _must_wait_for_result(self) -> bool:
        """Whether the next plan must wait for the newest step's tokens: it verifies drafts
        (what follows is not known yet) or has the executor draft (the drafts come with its
        result), or the next plan should propose drafts."""
        plan = self.in_flight[-1].plan
        return plan.has_drafts or plan.drafts_next or self.scheduler.wants_drafts()

    def _time_step(self, step: InFlightStep) -> None:
        """A step's device time: from its submission or the previous completion, whichever came
        later, to its own completion (speculation weighs drafts by it, a host tier swaps)."""
        now = time.monotonic()
        seconds = now - max(step.submitted_at, self._last_completed_at)
        self._last_completed_at = now
        if self.scheduler.speculator is not None:
            self.scheduler.speculator.policy.observe_step(step.plan.num_tokens, seconds)
        self.scheduler.connector.observe_step(step.plan.num_tokens, seconds)

    def _observe_host_gap(self) -> None:
        """A step about to be submitted with none in flight waited for the host since the last
        completion: the time that drafts expose, where work was waiting all along."""
        gap = time.monotonic() - self._last_completed_at
        if self._busy_after_completion and gap < _IDLE_GAP_S:
            self.scheduler.speculator.policy.observe_host_gap(gap)

    def step(self) -> list[RequestOutput]:
        """Blocking: launch what can run, wait for the oldest step and return its outputs."""
        self.launch()
        refused = self.take_refused()
        if not self.in_flight:
            if not refused and self.guided:
                self.guided.wait_for_one()  # only compiling requests are left
            return refused
        return refused + self.complete(self.in_flight[0].future.result())


def _connector(loaded: LoadedRank, preemption: PreemptionMode) -> KvConnector | None:
    """The host KV tier's scheduler half, where the rank has one."""
    if not loaded.num_host_blocks:
        return None
    return HostKvConnector(
        loaded.num_host_blocks, loaded.block_size, loaded.kv_block_bytes, preemption
    )


def _speculator(
    options: SpeculativeOptions | None, max_model_len: int, step_budget: int
) -> Speculator | None:
    if options is None or not options.method:
        return None
    proposer = None  # method "draft": the executor drafts
    if options.method == "ngram":
        proposer = NgramProposer(options.ngram_min, options.ngram_max)
    policy = SpeculationPolicy(options.num_tokens, options.dynamic, step_budget)
    return Speculator(proposer, policy, max_model_len)
