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


@pytest.mark.parametrize(
    ("settings", "tiles"),
    [
        ({}, {1: 64, 127: 64, 128: 128, 256: 128}),  # the default: 128 keys from 128 sequences
        ({"decode_attention_tile_128_from": 0}, {1: 64, 256: 64}),
        ({"decode_attention_tile_128_from": 8}, {7: 64, 8: 128}),
        ({"decode_attention_tile": 128, "decode_attention_tile_128_from": 0}, {1: 128, 256: 128}),
    ],
)
def test_large_decode_batches_take_keys_in_tiles_of_128(settings, tiles) -> None:
    backend = select_cuda_backend(
        DeviceOptions(decode_attention_warps=8, **settings), block_size=16
    )
    for num_seqs, tile in tiles.items():
        build = backend.decode_build_for(num_seqs)
        assert build.tile == tile, num_seqs
        assert build.warps == 8  # only the tile changes


def test_a_backend_that_cannot_run_on_cuda_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="'torch' does not run on CUDA"):
        select_cuda_backend(DeviceOptions(attention_backend="torch"), block_size=16)
