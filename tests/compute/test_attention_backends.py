"""Every attention backend fills the one typed seam the model and the runners call."""

from __future__ import annotations

import inspect

import pytest

from aioworker.compute.layers.attention import AttentionBackend, TorchAttentionBackend


def backends() -> list[type]:
    found = [TorchAttentionBackend]
    if _has("triton"):
        from aioworker.compute.layers.attention.cuda_backend import CudaAttentionBackend

        found.append(CudaAttentionBackend)
    if _has("xformers") and _has("triton"):
        from aioworker.compute.layers.attention.xformers_backend import XformersAttentionBackend

        found.append(XformersAttentionBackend)
    return found


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("backend", backends(), ids=lambda b: b.__name__)
def test_each_backend_has_the_protocols_members_and_parameters(backend: type) -> None:
    assert isinstance(backend.supports_graphs, bool) and isinstance(backend.name, str)
    for method in ("prepare_qkv", "forward"):
        wanted = list(inspect.signature(getattr(AttentionBackend, method)).parameters)
        assert list(inspect.signature(getattr(backend, method)).parameters) == wanted, method


def test_the_torch_backend_is_an_attention_backend_and_is_never_captured() -> None:
    backend = TorchAttentionBackend(block_size=16, sliding_window=None)
    assert isinstance(backend, AttentionBackend) and not backend.supports_graphs


def test_attend_where_a_backend_has_it_takes_both_steps_arguments() -> None:
    """`attend` (optional) is prepare_qkv and forward in one call: their arguments, and scale."""
    having = [b for b in backends() if hasattr(b, "attend")]
    if _has("triton"):
        assert having, "the Triton backend does a decode step's attention in one go"
    wanted = [*inspect.signature(AttentionBackend.prepare_qkv).parameters, "scale"]
    for backend in having:
        assert list(inspect.signature(backend.attend).parameters) == wanted, backend.__name__
