"""The converted-model cache follows a GGUF's content: copies at other paths share one directory,
and a file whose bytes change gets a new one."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from aioworker.checkpoint import gguf_import
from aioworker.checkpoint.source import converted_gguf_dir, gguf_content_key


@pytest.fixture
def conversions(monkeypatch, tmp_path) -> list[str]:
    """A private cache, and a converter that only records the files it was asked to convert."""
    monkeypatch.setenv("AIOWORKER_CACHE_DIR", str(tmp_path / "cache"))
    converted: list[str] = []

    def fake_convert(gguf_path, out_dir, progress=True):
        converted.append(str(gguf_path))
        out_dir.mkdir(parents=True)

    monkeypatch.setattr(gguf_import, "convert_gguf", fake_convert)
    return converted


def write_small_gguf(path, fill: float = 0.0):
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.full((4, 4), fill, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_copies_at_other_paths_convert_once(conversions, tmp_path) -> None:
    first = write_small_gguf(tmp_path / "venv-a" / "model.gguf")
    second = tmp_path / "venv-b" / "renamed.gguf"
    second.parent.mkdir()
    shutil.copyfile(first, second)
    target = converted_gguf_dir(first, progress=False)
    assert converted_gguf_dir(second, progress=False) == target
    assert converted_gguf_dir(first, progress=False) == target
    assert conversions == [str(first)]


def test_changed_content_changes_the_key(conversions, tmp_path) -> None:
    path = write_small_gguf(tmp_path / "model.gguf", fill=0.0)
    before = gguf_content_key(path)
    target = converted_gguf_dir(path, progress=False)
    size = path.stat().st_size
    write_small_gguf(path, fill=1.0)  # same header and tensor table, other weights
    assert path.stat().st_size == size
    assert gguf_content_key(path) != before
    assert converted_gguf_dir(path, progress=False) != target
    assert len(conversions) == 2
