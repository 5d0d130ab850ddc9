"""tools/gemv_candidates.py: a sweep compares each kernel option with itself off, so every FMA
tiling it times comes also pipelined, and --refine's neighbours toggle it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tools"))

from gemv_candidates import candidates, neighbours, refined  # noqa: E402

from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402


def test_every_fma_tiling_of_a_full_sweep_is_timed_also_pipelined() -> None:
    for fmt in ("none", "fp8", "wint8", "wint4"):
        fma = candidates(4096, 14336, False, False, 132, fmt)
        plain = [t for t in fma if not t.pipelined]
        assert plain and all(dataclasses.replace(t, pipelined=True) in fma for t in plain)
        assert not any(t.pipelined for t in candidates(4096, 14336, False, True, 132, fmt))


def test_neighbours_toggle_the_pipeline_and_its_depth_on_fma_tiles_only() -> None:
    fma = Tiles(False, 16, 512, 2, num_stages=4)
    near = neighbours(fma, "wint8")
    assert dataclasses.replace(fma, pipelined=True) in near
    piped = dataclasses.replace(fma, pipelined=True)
    assert {t.num_stages for t in neighbours(piped, "wint8") if t.pipelined} == {2, 4}
    assert not any(t.pipelined for t in neighbours(Tiles(True, 64, 128, 4), "wint8"))


def test_a_one_row_refine_tries_pipelined_fma_tiles() -> None:
    assert any(t.pipelined and not t.dot for t in refined(4096, 14336, False, "wint4", 1, 132))


def test_int4_blocks_tilings_are_timed_also_reading_a_step_ahead() -> None:
    for dot in (False, True):
        blocks = [t for t in candidates(4096, 14336, False, dot, 132, "wint4") if t.blocks]
        assert any(t.ahead for t in blocks) and any(not t.ahead for t in blocks)
        assert not any(t.ahead for t in candidates(4096, 14336, False, dot, 132, "wint8"))
    base = Tiles(True, 128, 256, 4, num_stages=1, blocks=True)
    assert dataclasses.replace(base, ahead=True) in neighbours(base, "wint4")
    assert not any(t.ahead for t in neighbours(Tiles(False, 16, 512, 2), "wint4"))
    assert any(t.ahead and t.dot for t in refined(4096, 14336, False, "wint4", 8, 132))


def test_a_refine_of_int4_groups_of_128_starts_from_32s_tiles_where_it_has_none(
    monkeypatch,
) -> None:
    from aioworker.compute.layers.gemv import choice

    tuned = Tiles(False, 256, 1024, 1, num_warps=8, num_stages=4, blocks=True)  # no seed's
    monkeypatch.setattr(choice, "tuned_table", lambda: {"4096x14336 int4 one": tuned})
    assert tuned in refined(4096, 14336, False, "wint4", 1, 132, int4_group=128)
    assert tuned in refined(4096, 14336, False, "wint4", 1, 132)
    monkeypatch.setattr(choice, "tuned_table", lambda: {"4096x14336 int4g128 one": None})
    assert tuned not in refined(4096, 14336, False, "wint4", 1, 132, int4_group=128)


def test_refines_try_int4_raw_tiles_where_groups_are_64_or_more() -> None:
    """int4's raw tiles (bits on the blocks' dot tiles) get timed where groups are 64 or more,
    and a step within one group only."""
    for rows in (1, 8):
        raw = [t for t in refined(4096, 14336, False, "wint4", rows, 132, 128)
               if t.dot and t.blocks and t.bits]  # fmt: skip
        assert raw and all(128 % t.block_k == 0 for t in raw)
        assert not any(t.dot and t.blocks and t.bits
                       for t in refined(4096, 14336, False, "wint4", rows, 132, 32)
                       if t.block_k > 32)  # fmt: skip
