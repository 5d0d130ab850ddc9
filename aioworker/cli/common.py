"""Options shared by the commands that build a worker config: --config, --model and --set."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
import traceback
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


def config_from_args(
    args: argparse.Namespace, options: dict[str, Any] | None = None
) -> WorkerConfig:
    """`options`: a command's own flags as dotted keys (None: not given); like --tp in serve,
    they win over a --set of the same key."""
    overrides: dict[str, Any] = {
        "model.path": args.model,
        "model.max_model_len": args.max_model_len,
        "device.kind": args.device,
        "model.dtype": args.dtype,
    }
    overrides |= parse_settings(args.set, "--set")
    overrides |= {key: value for key, value in (options or {}).items() if value is not None}
    return load_config(args.config, overrides)


def parse_settings(items: list[str], flag: str) -> dict[str, Any]:
    """KEY=VALUE items (values as TOML reads them, else bare strings) as dotted keys."""
    settings = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"{flag} {item!r} needs the form KEY=VALUE")
        settings[key.strip()] = _parse_value(raw.strip())
    return settings


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string


def fail(message: str, code: int = 2) -> int:
    print(f"aioworker: error: {message}", file=sys.stderr)
    return code


def setup_logging(config: WorkerConfig, rank_label: str, level: str) -> None:
    """Log lines carry the rank and pid; `runtime.log_format = "json"` gives one object per line."""
    if config.runtime.log_format == "json":
        formatter: logging.Formatter = _JsonFormatter(rank_label)
    else:
        formatter = logging.Formatter(
            f"%(asctime)s rank={rank_label} pid=%(process)d %(levelname)s %(name)s: %(message)s"
        )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


class _JsonFormatter(logging.Formatter):
    def __init__(self, rank_label: str) -> None:
        super().__init__()
        self.rank_label = rank_label

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": record.created,
            "level": record.levelname,
            "logger": record.name,
            "rank": self.rank_label,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(entry)
