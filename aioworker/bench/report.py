"""Print benchmark rows as a table and append them, dated, to docs/benchmarks.md."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path


def machine_description() -> str:
    import torch

    cpu = _cpuinfo_field("model name") or platform.processor() or platform.machine()
    text = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, {cpu_features()}"
    if torch.cuda.is_available():
        text = f"{torch.cuda.get_device_name()}, " + text
    return text


def cpu_features() -> str:
    """Which vector instructions torch's CPU kernels were built to use here, and the bf16 ones."""
    import torch

    from aioworker.compute.cpu_bf16 import BF16_FLAGS

    flags = set((_cpuinfo_field("flags") or "").split())
    bf16 = [flag for flag in BF16_FLAGS if flag in flags]
    return (
        f"CPU kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"bf16 by {' + '.join(bf16) if bf16 else 'conversion (no avx512_bf16 or AMX)'}"
    )


def _cpuinfo_field(name: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


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


def publish(record: str | Path | None, title: str, table: str, notes: str = "") -> None:
    """Print a benchmark's table and notes, and with `record` (a file) append them to it, dated
    and under `title`, as `append_to_doc` does."""
    print(table, notes, sep="\n", flush=True)
    if record:
        append_to_doc(record, title, table, notes)
