"""The tilings tools/gemv_tune.py times: every candidate of a full sweep, or --refine's few
around the table's entry. Each is a `Tiles`; the options a format can take are toggled on
copies of each tiling, so a sweep compares a kernel option with itself off."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from aioworker.compute.layers import pdl  # noqa: E402
from aioworker.compute.layers.gemv.choice import format_of, rule_tiles, table_entry  # noqa: E402
from aioworker.compute.layers.gemv.tiles import Tiles  # noqa: E402


def candidates(
    channels: int, depth: int, gated: bool, dot: bool, sms: int, fmt: str = "none"
) -> list[Tiles]:
    """Tilings that give the device between half a program and 16 programs per SM; for fp8,
    each dot tiling also with its rows quantized to e4m3 (a8), for a quantized format each
    tiling also widening by bit operations (bits), each split one also folded (fold), and each FMA
    one of a stored format also with x loaded in W's tile shape (wide_x), int8's widened a word
    at a time by PTX (words; on tensor cores also with one stage), int4's blocks layout's
    tilings (blocks, also reading each step's words a step early: ahead), and each FMA one also
    with its loads issued ahead (pipelined)."""
    if dot:
        grid = itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8))
    else:
        grid = itertools.product((16, 32), (256, 512, 1024), (1, 2, 4, 8))
    found = []
    for block_n, block_k, splits in grid:
        programs = -(-(channels // 2 if gated else channels) // block_n) * splits
        if depth // splits < block_k or not sms // 2 <= programs <= 16 * sms:
            continue
        base = Tiles(dot, block_n, block_k, splits, num_warps=4, num_stages=4)
        options = {
            "a8": dot and fmt == "fp8",
            "bits": fmt != "none",
            "fold": splits > 1,
            "wide_x": not dot and fmt != "wint4",
            "words": fmt == "wint8",
        }
        found += [base] + [
            dataclasses.replace(base, **{o: True}) for o, on in options.items() if on
        ]
    if not dot and fmt == "wint4":
        found += blocks_candidates(channels, depth, gated, sms)
    if not dot:  # each FMA tiling also with its loads issued ahead
        found += [dataclasses.replace(t, pipelined=True) for t in found]
    if dot and fmt == "wint4":  # int4's blocks on tensor cores, with and without a pipeline,
        # and with one stage reading each step's words during the step before
        bases = [t for t in found if not (t.bits or t.fold)]
        found += [dataclasses.replace(t, blocks=True, num_stages=s) for t in bases for s in (1, 4)]
        found += [dataclasses.replace(t, blocks=True, num_stages=1, ahead=True) for t in bases]
    if dot and fmt == "wint8":  # int8's bf16 pairs on tensor cores, also with one stage
        found += [dataclasses.replace(t, num_stages=1) for t in found if t.words]
    return found


# int4's blocks tiles (int4_blocks.py): a thread takes BLOCK_N * BLOCK_K / (1024 * warps) rows of
# one block, sharing x's loads and widening between them; 4 and 8 rows issue ~3.7 and ~3.4
# instructions a weight (tools/sass_mix.py), 8 rows with 4 warps at the edge of spilling.
BLOCKS_SHAPES = ((64, 512, 4), (128, 256, 4), (64, 256, 4), (32, 512, 2), (64, 256, 2),
                 (32, 256, 2), (32, 256, 1), (16, 512, 1))  # fmt: skip


def blocks_candidates(channels: int, depth: int, gated: bool, sms: int) -> list[Tiles]:
    found = []
    for (block_n, block_k, warps), splits in itertools.product(BLOCKS_SHAPES, (1, 2, 4, 8)):
        programs = -(-(channels // 2 if gated else channels) // block_n) * splits
        if depth // splits < block_k or not sms // 2 <= programs <= 16 * sms:
            continue
        base = Tiles(False, block_n, block_k, splits, warps, num_stages=4, blocks=True)
        bases = [base, dataclasses.replace(base, fold=True)] if splits > 1 else [base]
        found += bases + [dataclasses.replace(t, ahead=True) for t in bases]
    return found


def neighbours(base: Tiles, fmt: str, pdl_on: bool = False, int4_group: int = 32) -> list[Tiles]:
    """`base` and the tilings one step from it, and with each option the format has toggled
    (a8 for fp8's dot tiles, bits for a quantized format's tiles, fold for split K, wide_x for
    FMA tiles of a stored format, words for int8's, ahead for int4's blocks, pipelined for FMA
    tiles (and, pipelined, two stages or four), and with programmatic dependent launch on,
    prefetch)."""
    r = dataclasses.replace
    found = [
        base,
        r(base, splits=base.splits * 2),
        r(base, splits=max(1, base.splits // 2)),
        r(base, block_n=base.block_n * 2),
        r(base, block_n=max(8, base.block_n // 2)),
        r(base, block_k=base.block_k * 2),
        r(base, block_k=max(16, base.block_k // 2)),
    ]
    if base.dot and fmt == "fp8":
        found.append(r(base, a8=not base.a8))
    if fmt != "none":
        found.append(r(base, bits=not base.bits))
        if fmt == "wint4" and base.dot and not base.bits:  # bits dot tiles: a step within a
            # group (on int4's blocks: the raw tiles, int4_blocks_dot.py)
            found.append(r(base, bits=True, block_k=min(base.block_k, int4_group or 32)))
    if base.splits > 1:
        found.append(r(base, fold=not base.fold))
    if base.blocks:  # each step's words read during the step before, in registers
        found.append(r(base, ahead=not base.ahead))
    if base.blocks and not base.dot:  # the rows a thread shares x between: warps, same tile
        found += [
            r(base, num_warps=base.num_warps * 2),
            r(base, num_warps=max(1, base.num_warps // 2)),
        ]
    if base.dot and fmt in ("wint8", "wint4"):  # one stage: W skips shared memory (its values
        # are widened in registers; sass_mix counts 0.5-1.4 fewer instructions a weight)
        found.append(r(base, num_stages=1 if base.num_stages > 1 else 4))
    if not base.dot and fmt != "wint4":
        found.append(r(base, wide_x=not base.wide_x))
    if not base.dot:  # a step's loads issued ahead (Tiles.pipelined), and how far
        found.append(r(base, pipelined=not base.pipelined))
        if base.pipelined:
            found.append(r(base, num_stages=2 if base.num_stages > 2 else 4))
    if fmt == "wint8":
        found.append(r(base, words=not base.words))
    if pdl_on:
        found.append(r(base, prefetch=not base.prefetch))
    return found


def refined(
    channels: int, depth: int, gated: bool, fmt: str, rows: int, sms: int, int4_group: int = 0
) -> list[Tiles]:
    """--refine's candidates for one key: the table's tiles (the rule's where it names none or
    gives the shape to torch) and their neighbours, the rule's, and for one row an FMA tiling and
    the 2-8 rows' tiles."""
    weight_format = {"none": "dense", "fp8": "e4m3", "wint8": "int8"}.get(fmt)
    weight_format = weight_format or format_of(torch.uint8, int4_group)

    def tuned(rows_class: int) -> Tiles | None:
        entry = table_entry(rows_class, channels, depth, weight_format, gated, int4_group)
        return entry if isinstance(entry, Tiles) else None

    rule = rule_tiles(channels, depth, gated, sms)
    on = bool(pdl.launch_options())
    found = neighbours(tuned(rows) or rule, fmt, on, int4_group) + [rule]
    if fmt == "wint4":  # int4's blocks on tensor cores: every row count
        tensor_cores = Tiles(True, 128, 256, rule.splits, num_warps=4, num_stages=1, blocks=True)
        found += neighbours(tensor_cores, fmt, on, int4_group)
        if (int4_group or 32) >= 64:  # raw tiles: a step of one group (int4_blocks_dot.py)
            raw = dataclasses.replace(tensor_cores, block_k=min(128, int4_group), bits=True)
            found += neighbours(raw, fmt, on, int4_group)
    if rows == 1:
        fma = dataclasses.replace(rule, dot=False, block_n=16, block_k=512)
        found += neighbours(fma, fmt, on, int4_group)
        if fmt == "wint4":
            blocks = Tiles(False, 64, 256, rule.splits, num_warps=2, num_stages=4, blocks=True)
            found += neighbours(blocks, fmt, on, int4_group)
        # The 2-8 rows' tiles too: dot tiles pad one row to 16 as they pad 8, and fp8's a8
        # tiles (chosen there) multiply on fp8 tensor cores without widening any weight.
        few = tuned(2)
        if few is not None:
            found += neighbours(few, fmt, on, int4_group)
    fits = [
        t for t in found
        if depth // t.splits >= t.block_k and (t.dot or rows == 1)
        and (fmt != "wint4" or t.int4_misfit(int4_group or 32) is None)  # the product refuses
    ]  # fmt: skip
    return list(dict.fromkeys(fits))
