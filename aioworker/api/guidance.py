"""What a request asks its output to follow, from the fields a client may say it in: OpenAI's
`response_format`, vLLM's `guided_*` fields, or tool_choice "required" and a named function
(tools.py); at most one of them. The API only builds the GuidedParams: the workers compile them,
and an error about one comes back naming the field as the client wrote it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aioworker.api.errors import ApiError, invalid
from aioworker.api.schemas import (
    ChatRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
)
from aioworker.core.guided import GuidedParams


@dataclass(frozen=True)
class Guidance:
    guided: GuidedParams
    # The field the client gave it in: "guided_regex", "response_format.json_schema.schema".
    field: str

    def reword(self, message: str) -> str:
        """A message about `guided.<kind>` (the workers' name for it), naming the client's field."""
        return message.replace(f"guided.{self.guided.kind}", self.field)

    def rename(self, error: ApiError) -> ApiError:
        """The error, naming the client's field where it is about this guidance."""
        message = self.reword(error.message)
        if message == error.message:
            return error
        return ApiError(error.status, message, self.field, error.error_type, error.headers)


def request_guidance(
    body: CompletionRequest | ChatRequest, from_tools: Guidance | None = None
) -> Guidance | None:
    """The one constraint the body asks for, or None; 400 naming both when it asks for two."""
    found = [
        g
        for g in (response_format_guidance(body.response_format), *alias_guidance(body), from_tools)
        if g is not None
    ]
    if len(found) > 1:
        first, second = found[0].field, found[1].field
        raise invalid(
            f"{first} and {second} both constrain the output; give only one of them", second
        )
    return found[0] if found else None


def response_format_guidance(form: ResponseFormat | None) -> Guidance | None:
    if isinstance(form, JsonObjectFormat):
        return Guidance(GuidedParams(json_object=True), "response_format")
    if isinstance(form, JsonSchemaFormat):
        field = "response_format.json_schema.schema"
        if form.json_schema.schema is None:
            raise invalid(f"{field} is required: give the JSON schema the output follows", field)
        return Guidance(GuidedParams(json_schema=form.json_schema.schema), field)
    return None  # none, or {"type": "text"}: no constraint


def alias_guidance(body: CompletionRequest | ChatRequest) -> list[Guidance]:
    """vLLM's fields, each as the GuidedParams of its kind."""
    found = []
    if body.guided_json is not None:
        schema = schema_object(body.guided_json, "guided_json")
        found.append(Guidance(GuidedParams(json_schema=schema), "guided_json"))
    if body.guided_regex is not None:
        found.append(Guidance(GuidedParams(regex=body.guided_regex), "guided_regex"))
    if body.guided_choice is not None:
        choice = tuple(body.guided_choice)
        found.append(Guidance(GuidedParams(choice=choice), "guided_choice"))
    if body.guided_grammar is not None:
        found.append(Guidance(GuidedParams(grammar=body.guided_grammar), "guided_grammar"))
    return found


def schema_object(schema: dict[str, Any] | str, field: str) -> dict[str, Any]:
    """A schema given as JSON text, decoded here so that text which is not JSON is a 400 naming
    the field."""
    if isinstance(schema, dict):
        return schema
    try:
        decoded = json.loads(schema)
    except ValueError as exc:
        raise invalid(f"{field} is not valid JSON ({exc}); give a JSON schema", field) from None
    if not isinstance(decoded, dict):
        raise invalid(
            f"{field} is a JSON {type(decoded).__name__}; give a JSON schema object", field
        )
    return decoded
