"""What the HTTP server holds for its whole life: the client of the worker groups, the model's
tokenizer, the served model's name and context length, its options and metrics."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from pathlib import Path

from aioworker.api.errors import ApiError, unavailable
from aioworker.api.logprob_format import TokenTexts
from aioworker.api.metrics import ApiMetrics
from aioworker.checkpoint.model_config import load_model_config
from aioworker.checkpoint.source import resolve_model_path
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.config import ApiOptions, WorkerConfig
from aioworker.wire.client import Client


@dataclass
class Gateway:
    client: Client
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    options: ApiOptions
    metrics: ApiMetrics

    def __post_init__(self) -> None:
        self.texts = TokenTexts(self.tokenizer)
        # Response and request ids: unique to this process, cheaper than a uuid each.
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()

    def next_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):x}"

    @classmethod
    def from_config(cls, config: WorkerConfig, client: Client, progress: bool = False) -> Gateway:
        """Reads the model directory's tokenizer and config.json (no weights)."""
        model_dir = resolve_model_path(config.model.path, progress)
        max_model_len = (
            config.model.max_model_len or load_model_config(model_dir).max_position_embeddings
        )
        return cls(
            client,
            Tokenizer(model_dir),
            config.api.served_model_name or Path(config.model.path).name,
            max_model_len,
            config.api,
            ApiMetrics(),
        )

    def group_states(self) -> list[str]:
        """Each group's state, up to the last heartbeat that has arrived (a rank beats at once
        when its state changes, before an admin command reports it)."""
        return self.client.group_states()

    def is_ready(self, states: list[str] | None = None) -> bool:
        """Whether some group takes requests: runs them (READY) or queues them (paused, updating
        its weights); a request goes there, and /health answers 200."""
        states = self.group_states() if states is None else states
        return any(self.client.takes_requests(state) for state in states)

    def check_can_serve(self) -> None:
        """503 only when no group can take a request (every one missing, stale, starting,
        draining, stopped or failed); it names each group's state. A group whose state queues
        requests takes them: they run when it resumes."""
        states = self.group_states()
        if not self.is_ready(states):
            listed = ", ".join(f"group {g} {state}" for g, state in enumerate(states))
            raise unavailable(f"no worker group can take requests ({listed}); retry later")

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(
                404,
                f"model {name!r} is not served here; this server serves {self.model_name!r}",
                "model",
                "not_found_error",
            )

    @property
    def timeout_s(self) -> float | None:
        return self.options.request_timeout_s or None
