"""Which tiles multiply a given product: the tuned table where it names the shape (written by
tools/gemv_tune.py on the GPU machine), else a rule. The table is the one swept on this machine's
kind of GPU where there is one (`tuned_tiles.<gpu>.json`), else the default (`tuned_tiles.json`,
swept on an H200): the best tiles follow the ratio of a card's issue rate to its bandwidth, which
differs between an H100 and an H200. The table may also say that torch's product
was the faster for a shape (an entry of null): then `tiles_for` says None, and the product is
left to the wrapped method.

The table is keyed by shape, weight format, gating and row class (one row, or 2 to 8: the dot
tiles pad every row count to 16, so 2 to 8 cost the same). int4 in groups of other than 32
inputs is a format of its own ("int4g128"); where the table has no entry for it, it takes the
32-input groups' tiles if they multiply its groups (Tiles.int4_misfit), else the rule's.

The rule: tensor-core tiles of 64 channels by 128 of K (int4: its blocks tiles, INT4_RULE),
and K split until the device has two programs per SM, each slice keeping at least 512 of K (a
split's partial sums are written and read again once).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path

import torch

from aioworker.compute.layers.gemv.tiles import Tiles
from aioworker.compute.layers.weight_only import INT4_GROUP

TABLE_PATH = Path(__file__).with_name("tuned_tiles.json")
INT4_VALUES = {torch.uint8: 2, torch.int32: 8}  # int4 values a stored unit holds
PROGRAMS_PER_SM = 2
MIN_K_PER_SPLIT = 512
MISSING = object()  # table_entry: the table names no such key
# int4 shapes the table does not name (other models, the LM heads' quantized copies) get the
# blocks tiles every Llama-3.1-8B int4 product chose in the sweeps (H200 and H100, 2026-12-05
# and 06): at one row FMA tiles of 64 x 256 with 2 warps, at 2-8 rows tensor-core tiles of
# 128 x 256 in one stage. The plain tensor-core tiles lost to tinygemm on every one of them.
INT4_RULE = {
    True: Tiles(dot=False, block_n=64, block_k=256, num_warps=2, num_stages=4, blocks=True),
    False: Tiles(dot=True, block_n=128, block_k=256, num_warps=4, num_stages=1, blocks=True),
}


def format_of(weight_dtype: torch.dtype, int4_group: int = 0) -> str:
    """uint8 and int32 weights are int4's: two values a byte, eight a word; "int4" in groups of
    32 inputs (or 0: not given), "int4g<group>" in others."""
    if weight_dtype in INT4_VALUES:
        return "int4" if int4_group in (0, INT4_GROUP) else f"int4g{int4_group}"
    known = {torch.float8_e4m3fn: "e4m3", torch.int8: "int8"}
    return known.get(weight_dtype, "dense")


def table_key(rows: int, channels: int, depth: int, fmt: str, gated: bool) -> str:
    return f"{channels}x{depth} {fmt}{' gated' if gated else ''} {'one' if rows == 1 else 'few'}"


def gpu_table_path(gpu_name: str) -> Path:
    """Where a table swept on `gpu_name` (torch.cuda.get_device_name()) lives, beside the
    default: "NVIDIA H100 80GB HBM3" -> tuned_tiles.nvidia-h100-80gb-hbm3.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return TABLE_PATH.with_name(f"{TABLE_PATH.stem}.{slug}.json")


def table_path() -> Path:
    """This machine's table: its GPU's own where one was swept, else the default."""
    if torch.cuda.is_available():
        own = gpu_table_path(torch.cuda.get_device_name())
        if own.exists():
            return own
    return TABLE_PATH


@functools.cache
def tuned_table() -> dict[str, Tiles | None]:
    path = table_path()
    if not path.exists():
        return {}
    entries = json.loads(path.read_text())["tiles"]
    return {key: Tiles(**fields) if fields else None for key, fields in entries.items()}


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The device's SMs (an H200's 132 where there is no GPU: Triton's interpreter)."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def rule_tiles(
    channels: int, depth: int, gated: bool, sms: int, fmt: str = "dense", rows_class: int = 2
) -> Tiles:
    """The rule's tiles; for int4, its blocks tiles (`INT4_RULE`)."""
    tiles = Tiles(dot=True, block_n=64, block_k=128, num_warps=4, num_stages=4)
    if fmt.startswith("int4"):
        tiles = INT4_RULE[rows_class == 1]
    output_tiles = -(-(channels // 2 if gated else channels) // tiles.block_n)
    splits = 1
    while (
        output_tiles * splits < PROGRAMS_PER_SM * sms and depth // (splits * 2) >= MIN_K_PER_SPLIT
    ):
        splits *= 2
    return dataclasses.replace(tiles, splits=splits)


def table_entry(
    rows_class: int, channels: int, depth: int, fmt: str, gated: bool, int4_group: int = 0
) -> Tiles | None | object:
    """The table's tiles for the key, None where it gives the shape to torch's product, or
    MISSING where it has no entry (for an int4 group of its own, nor a fitting 32-group one)."""
    table = tuned_table()
    key = table_key(rows_class, channels, depth, fmt, gated)
    if key in table:
        return table[key]
    if fmt.startswith("int4g"):
        as_32 = table.get(table_key(rows_class, channels, depth, "int4", gated), MISSING)
        if as_32 is None or isinstance(as_32, Tiles) and not as_32.int4_misfit(int4_group):
            return as_32
    return MISSING


@functools.cache
def _choose(
    rows_class: int, channels: int, depth: int, fmt: str, gated: bool, sms: int, int4_group: int
) -> Tiles | None:
    tuned = table_entry(rows_class, channels, depth, fmt, gated, int4_group)
    if tuned is not MISSING and (tuned is None or tuned.dot or rows_class == 1):
        return tuned  # (FMA tiles take one row only)
    rule = rule_tiles(channels, depth, gated, sms, fmt, rows_class)
    if fmt.startswith("int4") and rule.int4_misfit(int4_group or INT4_GROUP):
        return rule_tiles(channels, depth, gated, sms)
    return rule


def tiles_for(rows: int, weight: torch.Tensor, gated: bool, int4_group: int = 0) -> Tiles | None:
    """Tiles for `rows` rows times `weight` ([N, K], int4's packed, in groups of `int4_group`
    inputs; for `gated`, N = 2I), or None where torch's product measured faster."""
    channels, depth = weight.shape
    rows_class = 1 if rows == 1 else 2
    fmt = format_of(weight.dtype, int4_group)
    if weight.dtype in INT4_VALUES:
        depth *= INT4_VALUES[weight.dtype]
    return _choose(rows_class, channels, depth, fmt, gated, sm_count(weight.device), int4_group)
