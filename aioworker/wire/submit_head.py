"""Read who to answer from the head of a submit frame too large to decode: `request_id` and
`reply_to` come before the prompt in a SubmitRequest's msgpack map, and the prompt's token count
is its array's header, so the answer costs the same for 100 KB and for 64 MB. Nothing after the
prompt's header is read."""

from __future__ import annotations

from dataclasses import dataclass

_NAMES = frozenset({"type", "request_id", "reply_to"})
_PROMPT = "prompt_token_ids"


@dataclass(frozen=True)
class SubmitHead:
    request_id: str
    reply_to: str
    # Token ids in the prompt, or None when the head ends before the prompt's array.
    num_prompt_tokens: int | None


class _Reader:
    def __init__(self, body: memoryview) -> None:
        self.body, self.at = body, 0

    def uint(self, size: int) -> int:
        if self.at + size > len(self.body):
            raise ValueError("truncated")
        value = int.from_bytes(self.body[self.at : self.at + size], "big")
        self.at += size
        return value

    def length(self, fix_base: int, fix_max: int, wide: dict[int, int]) -> int:
        """A msgpack map / array / str header: its element (or byte) count."""
        marker = self.uint(1)
        if fix_base <= marker <= fix_max:
            return marker - fix_base
        if marker in wide:
            return self.uint(wide[marker])
        raise ValueError(f"unexpected msgpack marker {marker:#x}")

    def text(self) -> str:
        size = self.length(0xA0, 0xBF, {0xD9: 1, 0xDA: 2, 0xDB: 4})
        if self.at + size > len(self.body):
            raise ValueError("truncated")
        value = str(self.body[self.at : self.at + size], "utf-8")
        self.at += size
        return value


def read_submit_head(body: bytes | memoryview) -> SubmitHead | None:
    """The head of a msgpack-encoded SubmitRequest, or None when its first keys do not name a
    request id and a reply_to (another encoder's key order, or not a submit at all)."""
    reader = _Reader(memoryview(body).cast("B"))
    fields: dict[str, str] = {}
    num_tokens = None
    try:
        num_keys = reader.length(0x80, 0x8F, {0xDE: 2, 0xDF: 4})
        for _ in range(num_keys):
            key = reader.text()
            if key == _PROMPT:
                num_tokens = reader.length(0x90, 0x9F, {0xDC: 2, 0xDD: 4})
                break
            if key not in _NAMES:
                break
            fields[key] = reader.text()
    except ValueError:  # UnicodeDecodeError is one too
        pass
    if fields.get("type") != "submit" or "request_id" not in fields or "reply_to" not in fields:
        return None
    return SubmitHead(fields["request_id"], fields["reply_to"], num_tokens)
