"""Which tiles a product gets: the tuned table's where it names the shape, torch's product where
the table says torch was faster, else the rule (enough programs for every SM, slices of K no
thinner than 512)."""

from __future__ import annotations

import json

import pytest
import torch

from aioworker.compute.layers.gemv import choice
from aioworker.compute.layers.gemv.tiles import Tiles


@pytest.fixture
def table(monkeypatch, tmp_path):
    def install(entries: dict) -> None:
        path = tmp_path / "tuned.json"
        path.write_text(json.dumps({"device": "test", "tiles": entries}))
        monkeypatch.setattr(choice, "TABLE_PATH", path)
        choice.tuned_table.cache_clear()
        choice._choose.cache_clear()

    yield install
    choice.tuned_table.cache_clear()
    choice._choose.cache_clear()


@pytest.mark.parametrize(
    ("channels", "depth", "gated", "splits"),
    [
        (4096, 4096, False, 8),  # 64 channel tiles: 256 programs are still fewer than 2 x 132
        (4096, 14336, False, 8),  # K long enough for 8 slices of 1,792
        (28672, 4096, True, 2),  # 224 gated tiles, each reading gate and up rows
        (1024, 1024, False, 2),  # a third split would leave slices of 256
    ],
)
def test_the_rule_splits_k_until_every_sm_has_two_programs(
    table, channels, depth, gated, splits
) -> None:
    table({})
    weight = torch.empty(channels, depth, dtype=torch.bfloat16)
    assert choice.tiles_for(1, weight, gated) == Tiles(block_n=64, block_k=128, splits=splits,
                                                        num_stages=4)  # fmt: skip


def test_the_table_names_tiles_per_format_and_row_class(table) -> None:
    one = {
        "dot": False,
        "block_n": 32,
        "block_k": 512,
        "splits": 2,
        "num_warps": 4,
        "num_stages": 3,
    }
    few = {**one, "dot": True, "block_n": 128}
    table({
        "4096x4096 dense one": one,
        "4096x4096 dense few": few,
        "4096x4096 e4m3 one": None,
        "6144x4096 dense few": one,  # FMA tiles cannot take several rows
    })  # fmt: skip
    dense = torch.empty(4096, 4096, dtype=torch.bfloat16)
    assert choice.tiles_for(1, dense, False) == Tiles(**one)
    assert choice.tiles_for(8, dense, False) == Tiles(**few)
    assert choice.tiles_for(1, dense.to(torch.float8_e4m3fn), False) is None
    assert choice.tiles_for(1, dense, True) == choice.rule_tiles(4096, 4096, True, 132)
    qkv = torch.empty(6144, 4096, dtype=torch.bfloat16)
    assert choice.tiles_for(3, qkv, False).dot


def test_a_gpu_with_a_table_of_its_own_reads_it_and_others_the_default(
    table, monkeypatch, tmp_path
) -> None:
    table({"64x128 dense one": None})  # the default: torch's product
    own = choice.gpu_table_path("NVIDIA H100 80GB HBM3")
    assert own == tmp_path / "tuned.nvidia-h100-80gb-hbm3.json"
    own.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "tiles": {
        "64x128 dense one": {"dot": False, "block_n": 16, "block_k": 128}}}))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gpu, want in (("NVIDIA H100 80GB HBM3", Tiles(dot=False, block_n=16, block_k=128)),
                      ("NVIDIA H200", None)):  # fmt: skip
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=gpu: gpu)
        choice.tuned_table.cache_clear()
        assert choice.tuned_table()["64x128 dense one"] == want


def test_an_int4_group_of_its_own_takes_its_entry_else_32s_where_those_tiles_fit(table) -> None:
    blocks = {"dot": False, "block_n": 64, "block_k": 256, "splits": 2, "blocks": True}
    fma_64 = {"dot": False, "block_n": 16, "block_k": 64, "splits": 1}  # whole groups of 64 only
    own = {"dot": True, "block_n": 128, "block_k": 256, "splits": 4, "blocks": True}
    table({
        "4096x4096 int4 one": blocks,
        "4096x4096 int4 few": own,
        "4096x4096 int4g128 few": {**own, "splits": 8},
        "6144x4096 int4 one": fma_64,
        "6144x4096 int4 few": None,
    })  # fmt: skip
    o, qkv = torch.empty(4096, 512, dtype=torch.int32), torch.empty(6144, 512, dtype=torch.int32)
    assert choice.tiles_for(1, o, False, 32) == Tiles(**blocks)
    assert choice.tiles_for(1, o, False, 128) == Tiles(**blocks)  # 32's: blocks take any group
    assert choice.tiles_for(8, o, False, 128) == Tiles(**{**own, "splits": 8})  # its own entry
    assert choice.tiles_for(8, o, False, 32) == Tiles(**own)
    # 32's FMA tiles step 64 of K: not whole groups of 128, so the rule's tiles instead
    assert choice.tiles_for(1, qkv, False, 32) == Tiles(**fma_64)
    assert choice.tiles_for(1, qkv, False, 128) == choice.rule_tiles(
        6144, 4096, False, 132, "int4g128", 1
    )
    assert choice.tiles_for(8, qkv, False, 128) is None  # torch's product, as measured for 32
    assert choice.format_of(torch.uint8, 128) == "int4g128"
    assert choice.format_of(torch.uint8, 32) == choice.format_of(torch.int32) == "int4"


@pytest.mark.parametrize(
    ("tiles", "group", "misfit"),
    [
        (Tiles(block_k=128), 128, None),
        (Tiles(block_k=256, bits=True), 128, "one group a step"),
        (Tiles(dot=False, block_k=64), 128, "whole groups"),
        (Tiles(dot=False, block_k=192), 128, "do not nest"),
        (Tiles(dot=False, block_k=256, blocks=True), 128, None),
        (Tiles(dot=False, block_k=16, blocks=True), 16, "blocks of 32"),
    ],
)
def test_int4_misfit_names_why_tiles_cannot_take_a_group(tiles, group, misfit) -> None:
    found = tiles.int4_misfit(group)
    assert found is None if misfit is None else misfit in found


def test_the_rule_gives_int4_its_blocks_tiles_where_they_take_the_groups(table) -> None:
    table({})
    head = torch.empty(151936, 1024 // 8, dtype=torch.int32)  # an LM head's quantized copy
    one, few = choice.tiles_for(1, head, False, 32), choice.tiles_for(4, head, False, 32)
    assert one == Tiles(False, 64, 256, 1, num_warps=2, num_stages=4, blocks=True)
    assert few == Tiles(True, 128, 256, 1, num_warps=4, num_stages=1, blocks=True)
    o = torch.empty(4096, 4096 // 2, dtype=torch.uint8)
    assert choice.tiles_for(1, o, False, 128).splits == 8  # the split rule as for bf16
    # groups of 16 are no whole blocks of 32: the plain tensor-core rule
    assert choice.tiles_for(1, o, False, 16) == choice.rule_tiles(4096, 4096, False, 132)
    bf16 = torch.empty(4096, 4096, dtype=torch.bfloat16)
    assert not choice.tiles_for(1, bf16, False).blocks
