"""Options shared by the commands that build a worker config: --config, --model and --set."""

from __future__ import annotations

import argparse
import sys
import tomllib
from typing import Any

from aioworker.config import ConfigError, WorkerConfig, load_config


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("worker configuration")
    group.add_argument("--config", metavar="FILE", help="TOML worker config (see configs/)")
    group.add_argument(
        "--model",
        metavar="PATH",
        help="model directory, .gguf file, or 'embedded' (default: embedded SmolLM2-135M-Instruct)",
    )
    group.add_argument("--max-model-len", type=int, metavar="N", help="longest sequence in tokens")
    group.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where the model runs")
    group.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set cache.block_size=32 (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    overrides: dict[str, Any] = {
        "model.path": args.model,
        "model.max_model_len": args.max_model_len,
        "device.kind": args.device,
        "model.dtype": args.dtype,
    }
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} needs the form KEY=VALUE")
        overrides[key.strip()] = _parse_value(raw.strip())
    return load_config(args.config, overrides)


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string


def fail(message: str, code: int = 2) -> int:
    print(f"aioworker: error: {message}", file=sys.stderr)
    return code
