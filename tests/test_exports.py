"""The package root offers the names most programs need, and importing it loads none of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import aioworker
from aioworker.core.sampling_params import SamplingParams
from aioworker.engine import LLMEngine
from aioworker.wire.client import Client


def test_the_root_names_are_the_modules_own() -> None:
    assert (aioworker.LLMEngine, aioworker.Client) == (LLMEngine, Client)
    assert aioworker.SamplingParams is SamplingParams
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        aioworker.Engine  # noqa: B018


def test_importing_the_root_loads_no_heavy_module() -> None:
    code = "import aioworker, sys; print(sorted({'torch', 'zmq', 'aioworker.engine'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
