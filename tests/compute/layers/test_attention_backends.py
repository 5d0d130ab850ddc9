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
        # the default: 128 keys from 320 programs, 40 sequences over 8 KV heads, 80 over 4
        ({}, {(1, 8): 64, (39, 8): 64, (40, 8): 128, (256, 8): 128, (79, 4): 64, (80, 4): 128}),
        ({"decode_attention_tile_128_from_programs": 0}, {(1, 8): 64, (256, 8): 64}),
        ({"decode_attention_tile_128_from_programs": 8}, {(7, 1): 64, (8, 1): 128, (1, 8): 128}),
        (
            {"decode_attention_tile": 128, "decode_attention_tile_128_from_programs": 0},
            {(1, 8): 128, (256, 8): 128},
        ),
    ],
)
def test_large_decode_steps_take_keys_in_tiles_of_128(settings, tiles) -> None:
    """By programs, (sequence, KV head) pairs: a rank with fewer KV heads needs more sequences."""
    backend = select_cuda_backend(
        DeviceOptions(decode_attention_warps=8, **settings), block_size=16
    )
    for (num_seqs, num_kv_heads), tile in tiles.items():
        build = backend.decode_build_for(num_seqs, num_kv_heads)
        assert build.tile == tile, (num_seqs, num_kv_heads)
        assert build.warps == 8  # only the tile changes


def test_a_backend_that_cannot_run_on_cuda_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="'torch' does not run on CUDA"):
        select_cuda_backend(DeviceOptions(attention_backend="torch"), block_size=16)
