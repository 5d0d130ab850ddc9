"""Tools in the chat prompt: a template that takes tools is given them (and calls with their
arguments as objects); one that takes none (the embedded model's) gets them described in the
system message, and the conversation's calls and results written as Hermes text."""

from __future__ import annotations

import asyncio
import json

import pytest

from aioworker.api.prompts import chat_prompt, template_messages
from aioworker.api.schemas import decode_chat
from aioworker.api.tokenizing import PromptTokenizer
from aioworker.api.tool_calls import HermesParser
from aioworker.api.tool_prompt import describe_tools
from aioworker.checkpoint.tokenizer import Tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3 C"},
]
# A template that takes tools, in the manner of Qwen's.
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}"
    "{% endfor %}{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}\n{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    return Tokenizer(embedded_model_dir)


def messages(conversation: list[dict]):
    body = {"model": "m", "messages": conversation}
    return decode_chat(json.dumps(body).encode()).messages


def test_the_embedded_template_takes_no_tools_and_one_that_reads_them_does(tokenizer) -> None:
    assert not tokenizer.takes_tools
    saved, tokenizer.chat_template = tokenizer.chat_template, TOOL_TEMPLATE
    try:
        assert tokenizer.takes_tools
    finally:
        tokenizer.chat_template = saved


def test_without_template_support_the_tools_are_described_in_the_system_message() -> None:
    rendered = template_messages(messages(CONVERSATION), [TOOL], takes_tools=False)
    system = rendered[0]
    assert system["role"] == "system" and system["content"] == describe_tools([TOOL])
    assert json.dumps(TOOL) in system["content"] and "<tool_call>" in system["content"]
    call = rendered[2]["content"]
    assert rendered[2]["role"] == "assistant" and call.startswith("<tool_call>\n")
    parser = HermesParser()  # the calls are shown as the model is asked to write them
    parsed = parser.feed(call) + parser.finish()
    assert parsed.content == "" and parsed.calls[0].name == "get_weather"
    assert json.loads(parsed.calls[0].arguments) == {"city": "Oslo"}
    assert rendered[3] == {"role": "user", "content": "<tool_response>\n3 C\n</tool_response>"}


def test_a_system_message_of_the_clients_keeps_its_text_first() -> None:
    conversation = [{"role": "system", "content": "Be brief."}, CONVERSATION[0]]
    rendered = template_messages(messages(conversation), [TOOL], takes_tools=False)
    assert len(rendered) == 2
    assert rendered[0]["content"] == "Be brief.\n\n" + describe_tools([TOOL])


def test_without_tools_the_messages_are_as_they_were(tokenizer) -> None:
    rendered = template_messages(messages(CONVERSATION[:1]), None, takes_tools=False)
    assert rendered == [{"role": "user", "content": "Weather in Oslo?"}]


def test_a_template_that_takes_tools_gets_them_and_calls_with_object_arguments(tokenizer) -> None:
    rendered = template_messages(messages(CONVERSATION), [TOOL], takes_tools=True)
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert rendered[2] == {"role": "tool", "content": "3 C", "tool_call_id": "call_1"}
    saved, tokenizer.chat_template = tokenizer.chat_template, TOOL_TEMPLATE
    try:
        text = tokenizer.apply_chat_template(rendered, tools=[TOOL])
    finally:
        tokenizer.chat_template = saved
    assert text.startswith("TOOLS get_weather ")
    assert "assistant: CALL get_weather Oslo" in text and "tool: 3 C (for call_1)" in text


def test_the_chat_prompt_of_a_request_with_tools(tokenizer) -> None:
    tokens = PromptTokenizer(tokenizer, 2048, tokenizer.vocab_size, 1)
    try:
        body = decode_chat(json.dumps({"model": "m", "messages": CONVERSATION}).encode())
        prompt = asyncio.run(chat_prompt(body, tokens, [TOOL]))
    finally:
        tokens.close()
    text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou can call functions")
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"' in text
    assert text.endswith("<|im_start|>assistant\n")
