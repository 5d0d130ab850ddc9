"""Every message decodes strictly: an unknown or misspelled field anywhere is refused by name,
never dropped silently."""

from __future__ import annotations

import msgspec
import pytest

from aioworker.wire import protocol
from aioworker.wire.protocol import (
    ACK_DECODER,
    ADMIN_DECODER,
    CONTROL_DECODER,
    RESULT_DECODER,
    TASK_DECODER,
    VERSION_FRAME,
    ProtocolError,
)

SUBMIT = {
    "type": "submit",
    "request_id": "r",
    "prompt_token_ids": [1, 2],
    "params": {"max_tokens": 5},
    "reply_to": "ipc:///tmp/x",
}


def decode(decoder, body: dict):
    return decoder.decode([VERSION_FRAME, msgspec.msgpack.encode(body)])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SUBMIT, "params": {"temprature": 0, "max_token": 5}}, "temprature"),
        ({**SUBMIT, "priority": 1}, "priority"),
    ],
)
def test_a_misspelled_request_field_is_refused_by_name(body: dict, field: str) -> None:
    with pytest.raises(ProtocolError, match=f"unknown field `{field}`"):
        decode(TASK_DECODER, body)


@pytest.mark.parametrize(
    ("decoder", "body"),
    [
        (TASK_DECODER, {"type": "abort", "request_id": "r", "reason": "x"}),
        (ADMIN_DECODER, {"type": "admin", "command": "status", "force": True}),
        (ACK_DECODER, {"type": "ready", "rank": 1, "num_blocks": 2, "gpu": 0}),
        (CONTROL_DECODER, {"type": "shutdown", "reason": "", "now": True}),
        (
            CONTROL_DECODER,
            {"type": "weights", "phase": {"op": "stage", "version": 1, "mode": "x"}},
        ),
        (RESULT_DECODER, {"type": "rejected", "reason": "x", "code": 3}),
    ],
)
def test_every_channel_refuses_unknown_fields(decoder, body: dict) -> None:
    with pytest.raises(ProtocolError, match="unknown field"):
        decode(decoder, body)


def test_every_message_type_forbids_unknown_fields() -> None:
    structs = [
        value
        for value in vars(protocol).values()
        if isinstance(value, type) and issubclass(value, msgspec.Struct)
    ]
    assert len(structs) > 10
    lenient = [s.__name__ for s in structs if not s.__struct_config__.forbid_unknown_fields]
    assert not lenient
