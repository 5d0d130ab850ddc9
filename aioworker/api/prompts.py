"""A request body -> the token ids of its prompts, tokenized off the event loop and checked as
the worker would check them (in the vocabulary, no longer than max_model_len) before anything is
sent, each error naming the field: `prompt`, `prompt[2]`, `messages`. Chat messages go through
the chat template with the request's tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioworker.api.errors import invalid
from aioworker.api.schemas import ChatMessage, ChatRequest, CompletionRequest
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.api.tool_prompt import arguments_value, text_messages


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    # The prompt's text where it came as text (echo returns it).
    text: str | None = None


async def completion_prompts(body: CompletionRequest, tokens: PromptTokenizer) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    prompts = []
    for param, item in prompt_items(body.prompt):
        if isinstance(item, str):
            prompt = Prompt(await tokens.encode(item, param), item)
        else:
            tokens.check_token_ids(item, param)
            prompt = Prompt(list(item))
        tokens.check_fits(prompt.token_ids, param, param)
        prompts.append(prompt)
    return prompts


def prompt_items(prompt: str | list[Any]) -> list[tuple[str, str | list[int]]]:
    """Each prompt of the body with the name of its field."""
    if isinstance(prompt, str):
        return [("prompt", prompt)]
    if prompt and all(_is_token_id(t) for t in prompt):
        return [("prompt", prompt)]
    if prompt and (all(isinstance(p, str) for p in prompt) or all(map(_is_token_ids, prompt))):
        return [(f"prompt[{index}]", item) for index, item in enumerate(prompt)]
    raise invalid(
        "prompt must be a string, a list of strings, a list of token ids, or a list of such "
        "lists, and not empty",
        "prompt",
    )


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(_is_token_id(t) for t in value)


async def chat_prompt(
    body: ChatRequest, tokens: PromptTokenizer, tools: list[dict[str, Any]] | None = None
) -> Prompt:
    """`tools`: OpenAI's tool objects, given to the template, or described in the system
    message where the template takes none."""
    if not body.messages:
        raise invalid("messages is empty; give at least one message", "messages")
    takes_tools = tokens.tokenizer.takes_tools
    messages = template_messages(body.messages, tools, takes_tools)
    token_ids = await tokens.encode_chat(messages, tools=tools if takes_tools else None)
    tokens.check_fits(token_ids, "messages", "the chat prompt (messages in the chat template)")
    return Prompt(token_ids)


def template_messages(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None, takes_tools: bool
) -> list[dict[str, Any]]:
    """The messages as the chat template reads them: OpenAI's form for a template that takes
    tools, else with tools and calls written as text."""
    if not takes_tools:
        return text_messages(messages, tools)
    return [openai_message(message) for message in messages]


def openai_message(message: ChatMessage) -> dict[str, Any]:
    """A call's arguments as an object: what templates that take tools write out as JSON."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": call.function.name,
                    "arguments": arguments_value(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered
