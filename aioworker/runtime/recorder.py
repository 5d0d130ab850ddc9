"""Record a driver's task channel and outputs to a file, for `aioworker replay`.

The file is a sequence of length-prefixed msgpack records: every frame received on the task
socket (as received, malformed ones too) and every output message sent.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

_LENGTH = struct.Struct("<I")


class Record(msgspec.Struct, array_like=True, frozen=True):
    kind: Literal["task", "output"]
    time: float
    frames: list[bytes]


class Recorder:
    def __init__(self, path: str | Path) -> None:
        # Owner-only: the recording holds every prompt and output.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # also when the file was there before
        self._file = os.fdopen(fd, "ab", buffering=1 << 20)
        self._encoder = msgspec.msgpack.Encoder()

    def write(self, kind: str, frames: list[bytes]) -> None:
        body = self._encoder.encode(Record(kind, time.time(), [bytes(f) for f in frames]))
        self._file.write(_LENGTH.pack(len(body)) + body)

    def close(self) -> None:
        self._file.close()


def read_records(path: str | Path) -> Iterator[Record]:
    decoder = msgspec.msgpack.Decoder(Record)
    with open(path, "rb") as handle:
        while header := handle.read(_LENGTH.size):
            (length,) = _LENGTH.unpack(header)
            body = handle.read(length)
            if len(body) < length:
                return  # a recording cut short by a crash: the complete records stand
            yield decoder.decode(body)
