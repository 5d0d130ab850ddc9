"""Programmatic dependent launch (compute/layers/pdl.py): switched by device.pdl for Hopper and
later only, and every kernel launched so waits on the one before it (compiled for sm_90 on the
CPU: the GPU runs are in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioworker.compute.layers import pdl


def test_the_launch_keywords_follow_the_switch() -> None:
    try:
        pdl.enable(True)
        assert pdl.launch_options() == {"launch_pdl": True}
    finally:
        pdl.enable(False)
    assert pdl.launch_options() == {}


def test_switched_on_says_whether_any_launch_may_use_it() -> None:
    try:
        pdl.enable(True, graphs_only=True)
        assert pdl.switched_on() and pdl.launch_options() == {}  # graphs only, none now
        pdl.enable(True)
        assert pdl.switched_on()
    finally:
        pdl.enable(False)
    assert not pdl.switched_on()


def test_large_decode_graphs_are_captured_without_it() -> None:
    try:
        pdl.enable(True)
        with pdl.for_graph_batch(pdl.MAX_GRAPH_BATCH):
            assert pdl.launch_options() == {"launch_pdl": True}
        with pdl.for_graph_batch(pdl.MAX_GRAPH_BATCH + 1):
            assert pdl.launch_options() == {}
        assert pdl.launch_options() == {"launch_pdl": True}  # restored
    finally:
        pdl.enable(False)
    with pdl.for_graph_batch(1):
        assert pdl.launch_options() == {}  # off stays off


def test_the_graph_limit_is_the_ranks_setting() -> None:
    try:
        pdl.enable(True, graphs_only=True, max_graph_batch=8)
        assert pdl.max_graph_batch() == 8
        with pdl.for_graph_batch(8):
            assert pdl.launch_options() == {"launch_pdl": True}
        with pdl.for_graph_batch(9):
            assert pdl.launch_options() == {}
    finally:
        pdl.enable(False)
    assert pdl.max_graph_batch() == pdl.MAX_GRAPH_BATCH  # enable's default restores it


def test_a_rank_launches_with_it_only_inside_small_decode_graphs() -> None:
    """As a rank switches it (device.pdl): eager steps, prefill included, launch as usual."""
    try:
        pdl.enable(True, graphs_only=True)
        assert pdl.launch_options() == {}
        with pdl.for_graph_batch(1):
            assert pdl.launch_options() == {"launch_pdl": True}
        with pdl.for_graph_batch(pdl.MAX_GRAPH_BATCH + 1):
            assert pdl.launch_options() == {}
        assert pdl.launch_options() == {}
    finally:
        pdl.enable(False)


def test_a_rank_switches_it_on_for_hopper_and_not_for_wint8(monkeypatch) -> None:
    """wint8's decode measured slower with PDL (device.pdl_off_formats' default); the others and
    the CPU as before; an empty pdl_off_formats gives wint8 PDL too."""
    import msgspec

    from aioworker.compute import build_rank
    from aioworker.config import ConfigError, WorkerConfig, load_config

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(build_rank, "_hopper_or_later", lambda device: True)
    on, off = WorkerConfig(), msgspec.convert({"device": {"pdl": False}}, WorkerConfig)
    for name in ("none", "fp8", "wint4"):
        assert build_rank._pdl_pays(on, cuda, name), name
    assert not build_rank._pdl_pays(on, cuda, "wint8")
    every_format = msgspec.convert({"device": {"pdl_off_formats": []}}, WorkerConfig)
    assert build_rank._pdl_pays(every_format, cuda, "wint8")
    no_fp8 = msgspec.convert({"device": {"pdl_off_formats": ["fp8"]}}, WorkerConfig)
    assert not build_rank._pdl_pays(no_fp8, cuda, "fp8")
    assert build_rank._pdl_pays(no_fp8, cuda, "wint8")
    with pytest.raises(ConfigError, match=r"'int3'.*pdl_off_formats\[0\]"):
        load_config(overrides={"device.pdl_off_formats": ["int3"]})
    assert not build_rank._pdl_pays(off, cuda, "none")
    assert not build_rank._pdl_pays(on, cpu, "none")
    monkeypatch.setattr(build_rank, "_hopper_or_later", lambda device: False)
    assert not build_rank._pdl_pays(on, cuda, "none")


# The kernels a decode step launches with PDL, as pdl_compile.py compiles them for sm_90.
KERNEL_NAMES = ("_add_rms_norm_kernel", "_silu_and_mul_kernel", "_norm_rope_kernel",
                "_qkv_rope_cache_kernel", "_decode_partial", "merge_splits")  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_every_kernel_launched_so_waits_first() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("pdl_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" waits") == len(KERNEL_NAMES), done.stdout
    for name in KERNEL_NAMES:  # each named: a kernel left out of the script would not show
        assert f"compiled {name} waits" in done.stdout, done.stdout
