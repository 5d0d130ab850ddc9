"""What the HTTP server holds for its whole life: the client of the worker groups, the model's
tokenizer (and the pool that runs it), the model served under its names, its options and
metrics."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aioworker.api.errors import ApiError, unavailable
from aioworker.api.logprob_format import TokenTexts
from aioworker.api.metrics import ApiMetrics
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.checkpoint.model_config import load_model_config
from aioworker.checkpoint.source import resolve_model_path
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.config import ApiOptions, ConfigError, WorkerConfig
from aioworker.wire.client import Client


@dataclass(frozen=True)
class ServedModel:
    # The `model` names clients may give; answers carry the first.
    names: tuple[str, ...]
    # model.path as configured (/v1/models calls it `root`).
    root: str
    max_model_len: int
    # Token ids the model takes (its config.json), which may exceed the tokenizer's.
    vocab_size: int


@dataclass
class Gateway:
    client: Client
    tokenizer: Tokenizer
    model: ServedModel
    options: ApiOptions
    metrics: ApiMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.texts = TokenTexts(self.tokenizer)
        self.tokens = PromptTokenizer(
            self.tokenizer,
            self.model.max_model_len,
            self.model.vocab_size,
            self.options.tokenizer_threads,
        )
        self.metrics = ApiMetrics(self.model_name, self.client.latest_heartbeats)
        # Response and request ids: unique to this process, cheaper than a uuid each.
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()

    def next_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):x}"

    @classmethod
    def from_config(cls, config: WorkerConfig, client: Client, progress: bool = False) -> Gateway:
        """Reads the model directory's tokenizer and config.json (no weights), and the chat
        template file if api.chat_template names one."""
        model_dir = resolve_model_path(config.model.path, progress)
        model_config = load_model_config(model_dir)
        tokenizer = Tokenizer(model_dir)
        if config.api.chat_template:
            tokenizer.chat_template = read_chat_template(config.api.chat_template, tokenizer)
        model = ServedModel(
            config.api.served_model_names or (Path(config.model.path).name,),
            config.model.path,
            config.model.max_model_len or model_config.max_position_embeddings,
            model_config.vocab_size,
        )
        return cls(client, tokenizer, model, config.api)

    @property
    def model_name(self) -> str:
        return self.model.names[0]

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def close(self) -> None:
        self.tokens.close()

    def group_states(self) -> list[str]:
        """Each group's state, up to the last heartbeat that has arrived (a rank beats at once
        when its state changes, before an admin command reports it)."""
        return self.client.group_states()

    def is_ready(self, states: list[str] | None = None) -> bool:
        """Whether some group takes requests: runs them (READY) or queues them (paused, updating
        its weights); a request goes there, and /health answers 200."""
        states = self.group_states() if states is None else states
        return any(self.client.takes_requests(state) for state in states)

    async def check_can_serve(self) -> None:
        """503 only when no group can take a request (every one missing, stale, starting,
        draining, stopped or failed); it names each group's state. A group whose state queues
        requests takes them: they run when it resumes. A request that comes before the groups'
        first beats have (the server started beside its workers) waits for them first."""
        states = self.group_states()
        if not self.is_ready(states):
            await self.client.first_beats()
            states = self.group_states()
        if not self.is_ready(states):
            listed = ", ".join(f"group {g} {state}" for g, state in enumerate(states))
            raise unavailable(f"no worker group can take requests ({listed}); retry later")

    def check_model(self, name: str | None) -> None:
        """None: the client named no model (allowed where the field is optional)."""
        if name is not None and name not in self.model.names:
            served = ", ".join(repr(n) for n in self.model.names)
            raise ApiError(
                404,
                f"model {name!r} is not served here; this server serves {served}",
                "model",
                "not_found_error",
            )

    @property
    def timeout_s(self) -> float | None:
        return self.options.request_timeout_s or None


def read_chat_template(path: str, tokenizer: Tokenizer) -> str:
    """The file's text, tried once on a user message so a broken template fails at start."""
    try:
        template = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"api.chat_template: cannot read {path}: {exc}") from None
    saved, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hello"}])
    except Exception as exc:  # jinja's syntax and render errors, and the template's own raise
        raise ConfigError(f"api.chat_template {path} does not render: {exc}") from None
    finally:
        tokenizer.chat_template = saved
    return template
