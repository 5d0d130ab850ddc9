"""What a request asks its output to match (`SamplingParams.guided`): a JSON schema, any JSON
object, a regular expression, a grammar (EBNF/GBNF) or one of a list of strings. Torch-free; the
grammar backend (compute/grammar/) compiles it, and `key` names it in the compiled-grammar cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from aioworker.core.request_errors import InvalidRequestError

# Bounds on what one request may ask the compile pool to do (characters of a schema, regex or
# grammar; choices and their length).
MAX_GUIDED_TEXT = 65536
MAX_CHOICES = 1024
MAX_CHOICE_LENGTH = 1024

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")


class GuidedParams(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """Exactly one of the five is given. `compact_json` drops the optional whitespace JSON
    allows (FastDeploy's disable_any_whitespace): shorter outputs, and no run of spaces a model
    may drift into."""

    # A JSON schema, as an object or its JSON text.
    json_schema: dict[str, Any] | str | None = None
    # Any JSON object.
    json_object: bool = False
    regex: str | None = None
    # EBNF in the GBNF dialect (llama.cpp's), rooted at `root ::= ...`.
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    compact_json: bool = False

    @property
    def kind(self) -> str:
        given = [name for name in KINDS if getattr(self, name) not in (None, False)]
        return given[0] if len(given) == 1 else ""

    def validate(self) -> None:
        """One kind, within its bounds; whether it compiles is the backend's to say."""
        given = [name for name in KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                f"guided gives {', '.join(given) or 'nothing'}; give exactly one of "
                f"{', '.join(KINDS)}"
            )
        if self.choice is not None:
            self._validate_choice()
        if isinstance(self.json_schema, str):  # before `text`, which parses it
            try:
                schema = json.loads(self.json_schema)
            except ValueError as exc:
                raise InvalidRequestError(f"guided.json_schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise InvalidRequestError("guided.json_schema must be a JSON object")
        text = self.text
        if len(text) > MAX_GUIDED_TEXT:
            raise InvalidRequestError(
                f"guided.{given[0]} has {len(text)} characters; at most {MAX_GUIDED_TEXT} are allowed"
            )

    def _validate_choice(self) -> None:
        if not 0 < len(self.choice) <= MAX_CHOICES:
            raise InvalidRequestError(
                f"guided.choice has {len(self.choice)} entries; give 1 to {MAX_CHOICES}"
            )
        for option in self.choice:
            if not 0 < len(option) <= MAX_CHOICE_LENGTH:
                raise InvalidRequestError(
                    f"guided.choice entry {option[:40]!r} has {len(option)} characters; each "
                    f"must have 1 to {MAX_CHOICE_LENGTH}"
                )

    @property
    def text(self) -> str:
        """The kind's content as one string (a schema as compact JSON; its keys keep their
        order, which is the order an object's properties are generated in)."""
        if self.json_schema is not None:
            schema = self.json_schema
            if isinstance(schema, str):
                schema = json.loads(schema)
            return json.dumps(schema, separators=(",", ":"))
        if self.choice is not None:
            return json.dumps(list(self.choice))
        return self.regex or self.grammar or ""

    @property
    def key(self) -> str:
        """Names the compiled grammar: equal for requests that ask for the same thing."""
        raw = f"{self.kind}\0{int(self.compact_json)}\0{self.text}"
        return hashlib.sha256(raw.encode()).hexdigest()
