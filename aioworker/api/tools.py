"""`tools` and `tool_choice` of a chat request: the tools checked (names, argument schemas), and
what the choice makes of the output. "none": plain text. "auto": text in which the model's own
tool-call format is parsed (tool_calls.py). "required" and a named function: JSON that a grammar
holds to, the list of calls or that function's arguments (tool_outputs.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from aioworker.api.errors import invalid
from aioworker.api.guidance import Guidance
from aioworker.api.schemas import ChatRequest, FunctionTool, NamedToolChoice
from aioworker.core.guided import GuidedParams

# OpenAI's rule for function names.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The arguments of a function declared without parameters.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ChatTools:
    # OpenAI's tool objects, as chat templates take them.
    tools: list[dict[str, Any]]
    # "none", "auto", "required" or "named".
    mode: str
    # The function a named tool_choice calls.
    name: str | None = None
    guidance: Guidance | None = None
    # parallel_tool_calls: false asks for one call at most.
    is_parallel: bool = True


def chat_tools(body: ChatRequest) -> ChatTools | None:
    """None where the request gives no tools (and names none in tool_choice)."""
    choice = body.tool_choice
    if not body.tools:
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise invalid("tool_choice names a tool call, but tools is empty; give tools", "tools")
        return None
    check_tools(body.tools)
    tools = [msgspec.to_builtins(tool) for tool in body.tools]
    if isinstance(choice, NamedToolChoice):
        return named(body.tools, tools, choice.function.name)
    parallel = body.parallel_tool_calls
    if choice == "required":
        guidance = Guidance(required_guided(body.tools, parallel), "tools")
        return ChatTools(tools, "required", None, guidance, parallel)
    return ChatTools(tools, choice or "auto", is_parallel=parallel)


def check_tools(tools: list[FunctionTool]) -> None:
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        function, field = tool.function, f"tools[{index}].function"
        if not NAME.fullmatch(function.name):
            raise invalid(
                f"{field}.name is {function.name[:80]!r}; a function name has 1 to 64 letters, "
                "digits, underscores or dashes",
                f"{field}.name",
            )
        if function.name in seen:
            raise invalid(f"{field}.name {function.name!r} is given twice; name each once", field)
        seen.add(function.name)
        kind = (function.parameters or {}).get("type", "object")
        if kind != "object":
            raise invalid(
                f"{field}.parameters has type {kind!r}; the arguments are a JSON object, so give "
                'a schema of "type": "object"',
                f"{field}.parameters",
            )


def named(specs: list[FunctionTool], tools: list[dict[str, Any]], name: str) -> ChatTools:
    """The output is the named function's arguments."""
    for index, tool in enumerate(specs):
        if tool.function.name == name:
            field = f"tools[{index}].function.parameters"
            guided = GuidedParams(json_schema=arguments_schema(tool))
            return ChatTools(tools, "named", name, Guidance(guided, field))
    given = ", ".join(repr(tool.function.name) for tool in specs)
    raise invalid(
        f"tool_choice names the function {name!r}, which is not in tools ({given}); name one "
        "of them",
        "tool_choice.function.name",
    )


def required_guided(tools: list[FunctionTool], is_parallel: bool = True) -> GuidedParams:
    """A list of one or more calls (one, where not `is_parallel`), each the name of a tool and
    arguments that follow its schema: one alternative per tool, so each name goes with its own
    arguments."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [tool.function.name]},
                "parameters": arguments_schema(tool),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not is_parallel:
        schema["maxItems"] = 1
    return GuidedParams(json_schema=schema)


def arguments_schema(tool: FunctionTool) -> dict[str, Any]:
    return tool.function.parameters or NO_ARGUMENTS
