"""Text <-> token ids for a model directory, and chat templates. Torch-free: the API server and
the offline engine tokenize with this (core.detokenizer turns streamed ids back into text)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox
from tokenizers import Tokenizer as _HFTokenizer


class TokenizerError(ValueError):
    """The model directory's tokenizer files are missing or unusable."""


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"{path} is missing; text prompts need tokenizer.json (token-id prompts do not)"
            )
        self._tokenizer = _HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        self.config: dict[str, Any] = (
            json.loads(config_path.read_text()) if config_path.is_file() else {}
        )
        self.chat_template: str | None = self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take the default one
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default", next(iter(named.values()), None))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_unlocked(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """encode(), with the GIL released while the Rust tokenizer works (its single-text encode
        keeps it): for a thread that tokenizes while an event loop must go on answering."""
        batch = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return batch[0].ids

    @property
    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry, added tokens included, as the vocabulary
        spells it (byte-level entries one character per byte): no token stands for more
        characters of text than this, so a text longer than n times this has more than n tokens."""
        return max(map(len, self._tokenizer.get_vocab(with_added_tokens=True)), default=1)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """`tools`: OpenAI's tool objects, for a template that describes them (`takes_tools`)."""
        if not self.chat_template:
            raise TokenizerError(
                "this model has no chat template (tokenizer_config.json); drop --chat"
            )
        return _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self._special_text("bos_token"),
            eos_token=self._special_text("eos_token"),
        )

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template reads `tools` (else tools must be described in a message)."""
        return bool(self.chat_template) and "tools" in _variables(self.chat_template)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        # The template already writes the special tokens; do not add BOS again.
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    def _special_text(self, key: str) -> str:
        value = self.config.get(key) or ""
        return value.get("content", "") if isinstance(value, dict) else value


def _raise(message: str) -> None:
    raise TokenizerError(f"chat template error: {message}")


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, indent=indent, ensure_ascii=False
    )
    return env


# A server renders one template (two with a draft model's); parsing it is most of a render.
@functools.lru_cache(maxsize=4)
def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@functools.lru_cache(maxsize=4)
def _variables(template: str) -> frozenset[str]:
    """The names the template reads from its context."""
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(template)))
