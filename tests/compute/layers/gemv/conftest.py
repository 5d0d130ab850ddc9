"""The tests of this folder run the small-rows kernels whole on the CPU, under Triton's
interpreter (each test module sets TRITON_INTERPRET=1 before Triton is imported)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    from aioworker.compute.layers.gemv import method  # not at collection: it would load Triton

    monkeypatch.setattr(method, "INTERPRET_ON_CPU", True)
