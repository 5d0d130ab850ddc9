"""The in-process (offline) engine: submit prompts, step, read outputs. No sockets.

engine = LLMEngine.from_config(load_config())
for completion in engine.generate(["Hello"], SamplingParams(max_tokens=32)):
    print(completion.text)
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from aioworker.checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer
from aioworker.config import WorkerConfig
from aioworker.core.admission import RequestValidator
from aioworker.core.block_manager import BlockManager
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.scheduler import Scheduler
from aioworker.core.sequence import FinishReason, Sequence


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    text: str  # the text these tokens add ("" without a tokenizer)
    finish_reason: FinishReason | None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Completion:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None


class LLMEngine:
    def __init__(self, executor, loaded, tokenizer: Tokenizer | None, config: WorkerConfig) -> None:
        self.executor = executor
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.validator = RequestValidator(loaded.vocab_size, loaded.max_model_len)
        self.block_manager = BlockManager(loaded.num_blocks, loaded.block_size)
        self.scheduler = Scheduler(
            self.block_manager,
            config.scheduler.max_num_seqs,
            config.scheduler.max_num_batched_tokens,
            loaded.max_model_len,
        )
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        self._seqs_by_request: dict[str, Sequence] = {}
        # Up to two steps in flight: the next is scheduled and launched while one runs.
        self._in_flight: collections.deque = collections.deque()
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}

    @classmethod
    def from_config(cls, config: WorkerConfig, progress: bool = True) -> LLMEngine:
        from aioworker.compute.build_rank import build_rank  # torch enters here, not at import

        executor, loaded = build_rank(config, progress=progress)
        tokenizer = (
            Tokenizer(loaded.model_dir) if (loaded.model_dir / "tokenizer.json").is_file() else None
        )
        return cls(executor, loaded, tokenizer, config)

    # -- requests -----------------------------------------------------------------------------

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.loaded.model_dir} has no tokenizer.json; submit token ids instead of text"
            )
        if chat:
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a prompt (text or token ids); raises InvalidRequestError naming a bad field."""
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._request_ids)}"
        if request_id in self._seqs_by_request:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validator.check(token_ids, params)
        seq = Sequence(
            next(self._seq_ids), request_id, token_ids, params, self.loaded.eos_token_ids
        )
        self.scheduler.add(seq)
        self._seqs_by_request[request_id] = seq
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self._seqs_by_request.pop(request_id, None)
        if seq is None or self.scheduler.abort(seq.seq_id) is None:
            return None
        self._detokenizers.pop(request_id, None)
        return RequestOutput(request_id, [], "", FinishReason.ABORT)

    @property
    def has_unfinished(self) -> bool:
        # Steps still in flight for requests that ended are drained by the next step().
        return self.scheduler.has_work

    # -- stepping -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Wait for the oldest step in flight (launching the next first) and return its outputs."""
        while len(self._in_flight) < 2:
            plan = self.scheduler.schedule()
            if plan is None:
                break
            self._in_flight.append((plan, self.executor.submit(plan)))
        if not self._in_flight:
            return []
        plan, future = self._in_flight.popleft()
        result = future.result()
        outputs = []
        for request_id, token_id, reason in self.scheduler.update(plan, result):
            text = ""
            detokenizer = self._detokenizers.get(request_id)
            if detokenizer is not None:
                text = detokenizer.add([token_id])
            if reason is not None:
                self._seqs_by_request.pop(request_id, None)
                self._detokenizers.pop(request_id, None)
            outputs.append(RequestOutput(request_id, [token_id], text, reason))
        return outputs

    def stream(self) -> Iterator[RequestOutput]:
        while self.has_unfinished:
            yield from self.step()

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Run prompts to completion as one batch; completions come back in prompt order."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        completions: dict[str, Completion] = {}
        for prompt, p in zip(prompts, params_list, strict=True):
            token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            request_id = self.add_request(token_ids, p)
            completions[request_id] = Completion(request_id, token_ids)
        for out in self.stream():
            completion = completions.get(out.request_id)
            if completion is not None:
                completion.token_ids += out.new_token_ids
                completion.finish_reason = out.finish_reason
        if self.tokenizer is not None:
            for completion in completions.values():
                completion.text = self.tokenizer.decode(completion.token_ids)
        return list(completions.values())

    def close(self) -> None:
        self.executor.shutdown()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
