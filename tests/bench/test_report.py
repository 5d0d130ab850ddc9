"""The machine line every benchmark prints (which CPU features its kernels used), and how a
benchmark's table reaches the screen and, with --record, the document."""

from __future__ import annotations

import torch

from aioworker.bench import report


def test_the_machine_line_names_the_cpu_kernels_and_the_bf16_route(monkeypatch) -> None:
    flags = "fpu sse avx512f avx512_bf16 amx_tile amx_bf16"
    monkeypatch.setattr(report, "_cpuinfo_field", lambda name: flags if name == "flags" else "X")
    line = report.machine_description()
    assert line.startswith("X, ")
    capability = torch.backends.cpu.get_cpu_capability()
    assert f"CPU kernels {capability}, bf16 by avx512_bf16 + amx_bf16 + amx_tile" in line


def test_a_cpu_without_bf16_instructions_is_said_to_convert(monkeypatch) -> None:
    monkeypatch.setattr(report, "_cpuinfo_field", lambda name: "fpu sse avx2")
    assert report.cpu_features().endswith("bf16 by conversion (no avx512_bf16 or AMX)")


def test_publish_prints_and_appends_only_when_asked(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(report, "machine_description", lambda: "the machine")
    doc = tmp_path / "benchmarks.md"
    report.publish(None, "Title", "| a |", "the notes")
    assert capsys.readouterr().out == "| a |\nthe notes\n"
    assert not doc.exists()
    report.publish(doc, "Title", "| a |", "the notes")
    text = doc.read_text()
    assert "### Title (" in text and "Machine: the machine" in text
    assert text.index("| a |") < text.index("the notes")
