"""Which constraint a body asks for: response_format and vLLM's guided_* fields, each as its
GuidedParams; two of them, or a json_schema without its schema, refused naming the field; and an
error about `guided.<kind>` reworded to name the field the client wrote."""

from __future__ import annotations

import json

import pytest

from aioworker.api.errors import ApiError, invalid
from aioworker.api.guidance import Guidance, request_guidance
from aioworker.api.schemas import decode_chat, decode_completion
from aioworker.core.guided import GuidedParams

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}


def guidance_of(decode=decode_chat, **fields) -> Guidance | None:
    base = {"model": "m"}
    base |= {"prompt": "p"} if decode is decode_completion else {"messages": [{"role": "user"}]}
    return request_guidance(decode(json.dumps({**base, **fields}).encode()))


@pytest.mark.parametrize(
    ("fields", "guided", "field"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA},
                }
            },
            GuidedParams(json_schema=SCHEMA),
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_object"}},
            GuidedParams(json_object=True),
            "response_format",
        ),
        ({"guided_json": SCHEMA}, GuidedParams(json_schema=SCHEMA), "guided_json"),
        (
            {"guided_json": json.dumps(SCHEMA)},
            GuidedParams(json_schema=SCHEMA),
            "guided_json",
        ),
        ({"guided_regex": r"\d+"}, GuidedParams(regex=r"\d+"), "guided_regex"),
        ({"guided_choice": ["a", "b"]}, GuidedParams(choice=("a", "b")), "guided_choice"),
        (
            {"guided_grammar": 'root ::= "x"'},
            GuidedParams(grammar='root ::= "x"'),
            "guided_grammar",
        ),
    ],
)
@pytest.mark.parametrize("decode", [decode_chat, decode_completion])
def test_each_field_is_its_guided_params(decode, fields: dict, guided, field: str) -> None:
    assert guidance_of(decode, **fields) == Guidance(guided, field)


def test_no_constraint_and_text_are_none() -> None:
    assert guidance_of() is None
    assert guidance_of(response_format={"type": "text"}) is None


def test_two_constraints_are_refused_naming_both() -> None:
    form = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
    with pytest.raises(ApiError) as caught:
        guidance_of(response_format=form, guided_regex="a")
    assert caught.value.param == "guided_regex"
    assert "response_format.json_schema.schema and guided_regex" in caught.value.message
    tools = Guidance(GuidedParams(json_object=True), "tools")
    body = decode_chat(b'{"model": "m", "messages": [], "guided_choice": ["a"]}')
    with pytest.raises(ApiError, match="guided_choice and tools both"):
        request_guidance(body, tools)


def test_a_json_schema_format_without_its_schema_is_refused() -> None:
    with pytest.raises(ApiError) as caught:
        guidance_of(response_format={"type": "json_schema", "json_schema": {"name": "n"}})
    assert caught.value.param == "response_format.json_schema.schema"
    assert "is required" in caught.value.message


def test_errors_about_the_constraint_name_the_clients_field() -> None:
    guidance = Guidance(GuidedParams(regex="("), "guided_regex")
    error = guidance.rename(invalid("guided.regex does not compile: unclosed"))
    assert (error.message, error.param) == (
        "guided_regex does not compile: unclosed",
        "guided_regex",
    )
    other = invalid("max_tokens is 0", "max_tokens")
    assert guidance.rename(other) is other


@pytest.mark.parametrize(("text", "says"), [("{nope", "is not valid JSON"), ("[1]", "JSON list")])
def test_guided_json_text_that_is_no_schema_is_refused(text: str, says: str) -> None:
    with pytest.raises(ApiError) as caught:
        guidance_of(guided_json=text)
    assert caught.value.param == "guided_json" and says in caught.value.message
