"""Which CUDA attention backend a rank's settings choose, and how its decode programs are built
(compute/layers/attention/__init__.py). Built on the CPU: nothing here launches a kernel."""

from __future__ import annotations

import pytest

from aioworker.compute.layers.attention import select_cuda_backend
from aioworker.compute.layers.attention.triton_decode import DecodeBuild
from aioworker.config import DeviceOptions


def test_the_decode_attention_settings_build_the_decode_programs() -> None:
    default = select_cuda_backend(DeviceOptions(), block_size=16)
    assert default.decode_build == DecodeBuild()
    options = DeviceOptions(
        decode_attention_warps=8, decode_attention_stages=5, decode_attention_tile=128
    )
    assert select_cuda_backend(options, block_size=16).decode_build == DecodeBuild(
        warps=8, stages=5, tile=128
    )


def test_a_backend_that_cannot_run_on_cuda_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="'torch' does not run on CUDA"):
        select_cuda_backend(DeviceOptions(attention_backend="torch"), block_size=16)
