"""The host tier's copies (compute/host_kv.py): blocks go to the host and come back bit for
bit, in either cache layout and any dtype; a failed copy is reported, not raised; a pool too
large to reserve stops start-up naming the key and the size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aioworker.compute.host_kv import HostKvAllocationError, HostKvCopies, allocate_host_pool
from aioworker.compute.host_tier_setup import block_dim_of
from aioworker.compute.kv_cache import token_major_shape
from aioworker.compute.layers.attention.torch_backend import TorchAttentionBackend
from aioworker.core.kv_connector import KvCopy, KvTransfers

NUM_BLOCKS, BLOCK_SIZE = 8, 4


def layers(shape_of, dtype: torch.dtype, device: str = "cpu") -> list[SimpleNamespace]:
    """Two layers of different head counts, filled with distinct values."""
    out = []
    for heads, head_dim in ((2, 8), (1, 16)):
        shape = shape_of(NUM_BLOCKS, BLOCK_SIZE, heads, head_dim)
        k = torch.randn(shape, device=device).to(dtype)
        v = torch.randn(shape, device=device).to(dtype)
        out.append(SimpleNamespace(k_cache=k, v_cache=v))
    return out


def block(layer_list, block_dim: int, block_id: int) -> list[torch.Tensor]:
    return [
        cache.select(block_dim, block_id).clone()
        for layer in layer_list
        for cache in (layer.k_cache, layer.v_cache)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("shape_of", [token_major_shape, TorchAttentionBackend.cache_shape])
def test_blocks_round_trip_bit_exactly(shape_of, dtype) -> None:
    kv = layers(shape_of, dtype)
    block_dim = block_dim_of(shape_of)
    copies = HostKvCopies(lambda: kv, num_slots=5, device=torch.device("cpu"), block_dim=block_dim)
    saved = {b: block(kv, block_dim, b) for b in (1, 6)}
    copies.issue(KvTransfers(saves=[KvCopy(0, [1, 6], [4, 0])]))
    for layer in kv:  # the device blocks are overwritten (evicted, reused)
        for cache in (layer.k_cache, layer.v_cache):
            cache.view(torch.uint8).zero_()
    copies.issue(KvTransfers(loads=[KvCopy(1, [3, 2], [4, 0])]))
    for original, device_block in ((1, 3), (6, 2)):
        for want, got in zip(saved[original], block(kv, block_dim, device_block), strict=True):
            assert torch.equal(want.view(torch.uint8), got.view(torch.uint8))
    untouched = block(kv, block_dim, 5)
    assert all(not t.view(torch.uint8).any() for t in untouched)
    report = copies.report(wait=False)
    assert report.done == [0, 1] and not report.failed
    assert report.bytes_saved == report.bytes_loaded == 2 * copies.block_bytes
    assert copies.is_idle and copies.report(wait=False) is None


def test_a_failed_copy_is_reported_with_its_cause() -> None:
    kv = layers(token_major_shape, torch.float32)
    copies = HostKvCopies(lambda: kv, num_slots=2, device=torch.device("cpu"))
    copies.issue(KvTransfers(saves=[KvCopy(7, [0], [5])]))  # slot 5 does not exist
    report = copies.report(wait=False)
    assert report.failed == [7] and report.done == []
    assert "IndexError" in report.error


def test_a_pool_too_large_names_the_key_and_the_size() -> None:
    with pytest.raises(HostKvAllocationError) as error:
        allocate_host_pool(1 << 30, 1 << 30, pin=False)  # an exbibyte
    assert "cache.host_kv_bytes" in str(error.value)
    assert "1073741824.00 GiB" in str(error.value)


@pytest.mark.gpu
def test_on_the_gpu_blocks_round_trip_bit_exactly_while_a_step_runs() -> None:
    """Copies run on their own stream: a save issued before a long kernel on the compute stream
    overlaps it, and the blocks come back bit for bit."""
    device = torch.device("cuda")
    kv = layers(token_major_shape, torch.bfloat16, "cuda")
    # Blocks of 8 MiB: the copy's time on the device outlasts the host's time to queue it.
    big = [
        SimpleNamespace(
            k_cache=torch.randn(64, 256, 8, 128, device=device, dtype=torch.bfloat16),
            v_cache=torch.randn(64, 256, 8, 128, device=device, dtype=torch.bfloat16),
        )
        for _ in range(8)
    ]
    for caches, blocks in ((kv, [1, 6]), (big, list(range(0, 64, 2)))):
        copies = HostKvCopies(lambda c=caches: c, len(blocks), device)
        saved = [block(caches, 0, b) for b in blocks]
        copies.issue(KvTransfers(saves=[KvCopy(0, blocks, list(range(len(blocks))))]))
        x = torch.randn(4096, 4096, device=device)
        started, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started.record()
        for _ in range(20):  # the step: on the compute stream, queued after the save
            x = x @ x / 64
        ended.record()
        copies.wait_all()
        copy = copies._in_flight[0]
        if caches is big:  # the save's window overlaps the step's
            torch.cuda.synchronize()
            assert copy.started.elapsed_time(ended) > 0 and started.elapsed_time(copy.ended) > 0
        for layer in caches:
            layer.k_cache.zero_()
            layer.v_cache.zero_()
        copies.issue(
            KvTransfers(loads=[KvCopy(1, blocks, list(range(len(blocks))))], completed=[0])
        )
        report = copies.report(wait=True)
        assert report.done == [0, 1] and report.seconds_saving > 0
        for want, b in zip(saved, blocks, strict=True):
            got = block(caches, 0, b)
            assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
