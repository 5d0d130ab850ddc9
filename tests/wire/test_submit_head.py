"""The head of a submit frame names its request, its reply_to and its prompt's length, read
without decoding the rest; anything else reads as no head."""

from __future__ import annotations

import msgspec
import pytest

from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.protocol import SubmitRequest, encode
from aioworker.wire.submit_head import SubmitHead, read_submit_head


@pytest.mark.parametrize("num_tokens", [0, 15, 16, 65535, 65536, 200_000])
def test_the_client_s_encoding_has_a_readable_head(num_tokens: int) -> None:
    message = SubmitRequest(
        request_id="r-1",
        reply_to="ipc:///run/aioworker/c-inbox",
        prompt_token_ids=[7] * num_tokens,
        params=SamplingParams(stop=("x" * 100_000,)),
    )
    body = encode(message)[1]
    assert read_submit_head(body) == SubmitHead("r-1", "ipc:///run/aioworker/c-inbox", num_tokens)


def test_a_head_cut_off_before_the_prompt_still_names_the_request() -> None:
    body = encode(
        SubmitRequest(
            request_id="r", reply_to="ipc://x", prompt_token_ids=[1], params=SamplingParams()
        )
    )[1]
    cut = body[: body.index(b"prompt_token_ids") - 1]
    assert read_submit_head(cut) == SubmitHead("r", "ipc://x", None)


@pytest.mark.parametrize(
    "body",
    [
        # Another encoder's key order: the prompt before reply_to.
        msgspec.msgpack.encode(
            {"type": "submit", "request_id": "r", "prompt_token_ids": [1], "reply_to": "ipc://x"}
        ),
        msgspec.msgpack.encode({"type": "abort", "request_id": "r", "reply_to": "ipc://x"}),
        msgspec.msgpack.encode({"type": "submit", "request_id": 5, "reply_to": "ipc://x"}),
        msgspec.msgpack.encode([1, 2, 3]),
        b"\x83\xa4type\xa6sub",  # truncated inside a string
        b"\x83\xa4type\xa6\xff\xfe\xfd\xfc\xfb\xfa",  # not UTF-8
        b"",
    ],
)
def test_anything_else_has_no_head(body: bytes) -> None:
    assert read_submit_head(body) is None
