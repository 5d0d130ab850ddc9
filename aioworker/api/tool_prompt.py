"""Tools for a chat template that takes none (SmolLM2's ChatML, for one): the tools described in
the system message, and the conversation's calls and results written as text, all in Hermes'
format, so the model is asked for calls in the format tool_calls.py reads back."""

from __future__ import annotations

import json
from typing import Any

from aioworker.api.schemas import ChatMessage, ToolCall

INSTRUCTIONS = """\
You can call functions to answer. Each function is described by a JSON schema in <tools></tools>:
<tools>
{tools}
</tools>
To call a function, answer with a JSON object holding its name and arguments between \
<tool_call> and </tool_call> tags, one call per pair of tags:
<tool_call>
{{"name": <function name>, "arguments": <arguments as a JSON object>}}
</tool_call>"""


def describe_tools(tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return INSTRUCTIONS.format(tools=listed)


def text_messages(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """The messages with tool calls and results as text, and the tools (if any) described in
    the system message (the first one, or one added before the others)."""
    rendered = [text_message(m) for m in messages]
    if not tools:
        return rendered
    description = describe_tools(tools)
    first = rendered[0] if rendered else None
    if first is not None and first["role"] in ("system", "developer"):
        first["content"] = (
            f"{first['content']}\n\n{description}" if first["content"] else description
        )
        return rendered
    return [{"role": "system", "content": description}, *rendered]


def text_message(message: ChatMessage) -> dict[str, str]:
    if message.role == "tool":
        # Results come back in the user's turn, as Hermes-format models are trained to read them.
        return {"role": "user", "content": f"<tool_response>\n{message.text}\n</tool_response>"}
    content = message.text
    if message.tool_calls:
        calls = "\n".join(call_text(call) for call in message.tool_calls)
        content = f"{content}\n{calls}" if content else calls
    return {"role": message.role, "content": content}


def call_text(call: ToolCall) -> str:
    body = {"name": call.function.name, "arguments": arguments_value(call.function.arguments)}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def arguments_value(arguments: str) -> Any:
    """The arguments as an object where their text is JSON (templates write them as JSON)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
