"""Print benchmark rows as a table and append them, dated, to docs/benchmarks.md."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path


def machine_description() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    if torch.cuda.is_available():
        text = f"{torch.cuda.get_device_name()}, " + text
    return text


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in [header, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def append_to_doc(path: str | Path, title: str, table: str, notes: str = "") -> None:
    path = Path(path)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = f"\n### {title} ({stamp})\n\nMachine: {machine_description()}\n\n{table}\n"
    if notes:
        section += f"\n{notes}\n"
    with path.open("a") as handle:
        handle.write(section)
