"""Shared fixtures: the embedded model converted once, and tiny random Hugging Face models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from aioworker.checkpoint.source import resolve_model_path
from aioworker.config import load_config

# Triton picks compiled or interpreted when a kernel is defined, so on a machine without an NVIDIA
# driver (no /dev/nvidiactl) every kernel must be defined under its interpreter, whichever test
# module imports one first. Set once here, before any module is collected: the modules' own
# settings came too late after another had imported the kernels (test_attention_backends before
# test_triton_decode failed 12 tests).
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Enough KV cache for every test prompt, small enough to allocate fast. float32: the suite
# checks invariances exactly (a request alone or in a batch, cached or computed, TP=2 or 1,
# drafts verified or tokens decoded one by one) that bfloat16's rounding keeps only up to near
# ties, and "auto" picks bfloat16 on processors that compute it (these machines do).
EMBEDDED_OVERRIDES = {
    "cache.num_blocks": 512,
    "model.max_model_len": 2048,
    "model.dtype": "float32",
}


@pytest.fixture(autouse=True)
def seeded_torch() -> None:
    """Every test draws the same random numbers whatever ran before it, so a bound that holds
    once holds in CI. Torch-free tests stay torch-free: only a torch already imported is seeded."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    return resolve_model_path("embedded", progress=False)


def make_engine(model_dir: Path, **overrides):
    from aioworker.engine import LLMEngine

    settings = {"model.path": str(model_dir), **EMBEDDED_OVERRIDES, **overrides}
    return LLMEngine.from_config(load_config(overrides=settings), progress=False)


@pytest.fixture(scope="session")
def embedded_engine(embedded_model_dir: Path):
    engine = make_engine(embedded_model_dir)
    yield engine
    engine.close()


# Fake-executor workers for the control-tool tests (test_cli_admin, test_cli_top).
@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory):
    from tests.cli_workers import Workers

    workers = Workers(tmp_path_factory.mktemp("workers"))
    yield workers
    workers.kill_all()


@pytest.fixture(scope="module")
def ready_worker(workers):
    return workers.start()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test that may have built engines, hand their freed memory back to the system:
    glibc keeps freed weights in its arenas otherwise, and one process runs the whole suite
    (it reached 12 GB of RSS without this)."""
    if item.get_closest_marker("slow") is None:
        return
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass
