"""Write a safetensors file from raw little-endian buffers, without torch: the driver (which
never imports torch) stores tensors a trainer pushed over ZeroMQ, so every rank can load its
shard from them like any checkpoint."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from aioworker.wire.protocol import TensorMeta

ELEMENT_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1}
_FROM_TORCH_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
                     "int64": "I64", "int32": "I32", "uint8": "U8"}  # fmt: skip


def safetensors_dtype(name: str) -> str:
    code = _FROM_TORCH_NAMES.get(name, name.upper())
    if code not in ELEMENT_SIZES:
        raise ValueError(
            f"dtype {name!r} cannot be pushed; use one of {', '.join(_FROM_TORCH_NAMES)}"
        )
    return code


def write_safetensors(path: str | Path, metas: list[TensorMeta], buffers: list[bytes]) -> None:
    if len(metas) != len(buffers):
        raise ValueError(f"{len(metas)} tensors described but {len(buffers)} frames sent")
    header, offset = {}, 0
    for meta, buffer in zip(metas, buffers, strict=True):
        code = safetensors_dtype(meta.dtype)
        expected = math.prod(meta.shape) * ELEMENT_SIZES[code]
        if len(buffer) != expected:
            raise ValueError(
                f"{meta.name}: {len(buffer)} bytes sent, {expected} expected for {meta.dtype}{meta.shape}"
            )
        header[meta.name] = {
            "dtype": code,
            "shape": meta.shape,
            "data_offsets": [offset, offset + expected],
        }
        offset += expected
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        for buffer in buffers:
            handle.write(buffer)
