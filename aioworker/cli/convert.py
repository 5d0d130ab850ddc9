"""`aioworker convert`: turn a GGUF file into a Hugging Face model directory (dequantized)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aioworker.cli.common import fail


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "gguf",
        nargs="?",
        default="embedded",
        help="a .gguf file, or 'embedded' for SmolLM2-135M-Instruct (the default)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write the model directory here (default: the user cache, reused on later runs)",
    )


def run(args: argparse.Namespace) -> int:
    from aioworker.checkpoint.gguf_import import GGUFImportError, convert_gguf
    from aioworker.checkpoint.source import (
        ModelNotFoundError,
        embedded_gguf_path,
        resolve_model_path,
    )

    try:
        if args.out is None:
            print(resolve_model_path(args.gguf))
            return 0
        source = embedded_gguf_path() if args.gguf == "embedded" else Path(args.gguf)
        if not source.is_file():
            return fail(f"{source} is not a file; pass a .gguf file or 'embedded'")
        out = Path(args.out)
        if (out / "config.json").exists():
            return fail(f"{out} already holds a model (config.json); choose an empty --out")
        print(convert_gguf(source, out))
    except (GGUFImportError, ModelNotFoundError, ValueError) as exc:
        return fail(str(exc))
    return 0
