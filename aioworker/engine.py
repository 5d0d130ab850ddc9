"""The in-process (offline) engine: the engine core, an executor thread and a tokenizer in one
process. No sockets.

with LLMEngine.from_config(load_config()) as engine:
    for completion in engine.generate(["Hello"], SamplingParams(max_tokens=32)):
        print(completion.text)

Every sampling control of SamplingParams applies (penalties, min_p, logit_bias, allowed token
ids, bad words); `bad_words` turns words given as text into the token ids it takes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import msgspec

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.config import WorkerConfig
from aioworker.core.block_manager import BlockManager
from aioworker.core.engine_core import EngineCore
from aioworker.core.executor import Executor
from aioworker.core.loaded_rank import LoadedRank
from aioworker.core.output_text import OutputText
from aioworker.core.outputs import Completion, FinishReason, RequestOutput
from aioworker.core.sampling_params import SamplingParams, bad_words_token_ids
from aioworker.core.scheduler import Scheduler


class LLMEngine:
    def __init__(
        self,
        executor: Executor,
        loaded: LoadedRank,
        tokenizer: Tokenizer | None,
        config: WorkerConfig,
    ) -> None:
        self.executor = executor
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.core = EngineCore(
            executor,
            loaded,
            config.scheduler,
            None,
            config.cache.enable_prefix_caching,
            config.speculative,
            config.guided.fill_threads,
            config.cache.preemption,
        )
        self._request_ids = itertools.count()
        self._texts: dict[tuple[str, int], OutputText] = {}  # by request id and sample index

    @classmethod
    def from_config(cls, config: WorkerConfig, progress: bool = True) -> LLMEngine:
        from aioworker.compute.build_rank import build_rank  # torch enters here, not at import

        executor, loaded = build_rank(config, progress=progress)
        return cls(executor, loaded, loaded.tokenizer, config)

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def block_manager(self) -> BlockManager:
        return self.core.block_manager

    # -- requests -----------------------------------------------------------------------------

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.loaded.model_dir} has no tokenizer.json; submit token ids instead of text"
            )
        if chat:
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def bad_words(self, words: list[str]) -> tuple[tuple[int, ...], ...]:
        """`SamplingParams.bad_words_token_ids` for words given as text: each one as written and
        after a space, in this model's tokens."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ValueError(
                f"{self.loaded.model_dir} has no tokenizer.json; give bad_words_token_ids instead"
            )
        return bad_words_token_ids(
            lambda text: tokenizer.encode(text, add_special_tokens=False), words
        )

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a prompt (text or token ids); raises InvalidRequestError naming a bad field."""
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._request_ids)}"
        self.core.add(request_id, token_ids, params)
        if self.tokenizer is not None:
            for index in range(params.n):
                self._texts[(request_id, index)] = OutputText(self.tokenizer, params.stop)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now; its terminal output (of sample 0: with `n` samples, every one
        ends alike), or None if it had ended."""
        if not self.core.abort(request_id):
            return None
        for key in [key for key in self._texts if key[0] == request_id]:
            del self._texts[key]
        return self.core.terminal_output(request_id, FinishReason.ABORT)

    @property
    def has_unfinished(self) -> bool:
        # Steps still in flight for requests that ended are drained by the next step().
        return self.core.has_unfinished

    # -- stepping -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Wait for the oldest step in flight (launching the next first) and return its outputs,
        with the text each one adds (never a stop string, nor what follows it)."""
        outputs = self.core.step()
        if self.tokenizer is None:
            return outputs
        for index, out in enumerate(outputs):
            key = (out.request_id, out.sample_index)
            stream = self._texts.get(key)
            if stream is None:
                continue
            text = stream.add(out.token_ids)
            if out.finished:
                text += stream.finish()
                del self._texts[key]
            outputs[index] = msgspec.structs.replace(out, text=text)
        return outputs

    def stream(self) -> Iterator[RequestOutput]:
        while self.has_unfinished:
            yield from self.step()

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Run prompts to completion as one batch; completions come back in prompt order, and a
        request with `n` samples gives n of them in a row (sample 0 first)."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        completions: dict[tuple[str, int], Completion] = {}
        for prompt, p in zip(prompts, params_list, strict=True):
            token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            request_id = self.add_request(token_ids, p)
            for index in range(p.n):
                completions[(request_id, index)] = Completion(request_id, token_ids)
        for out in self.stream():
            completion = completions.get((out.request_id, out.sample_index))
            if completion is not None:
                completion.add(out)
                completion.text += out.text
        return list(completions.values())

    def close(self) -> None:
        """Stop the executor and let the model and KV cache go, even while this object lives
        on (a test framework keeps its fixtures' values to the end of the session)."""
        stopped = self.executor.shutdown()
        self.core.close()
        uninstall = getattr(self.executor, "uninstall", None)
        if stopped and uninstall is not None:
            uninstall()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
