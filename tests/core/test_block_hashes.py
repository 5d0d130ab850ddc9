"""Block content addresses: a keyed cryptographic chain, not Python's hash()."""

from __future__ import annotations

import hashlib
from array import array

from aioworker.core.block_hashes import DIGEST_BYTES, BlockHasher
from aioworker.core.block_manager import BlockManager

KEY = bytes(range(DIGEST_BYTES))


def test_each_digest_is_keyed_blake2b_of_the_parent_digest_and_the_token_bytes():
    hasher = BlockHasher(KEY)
    hashes: list[bytes] = []
    keys = hasher.extend(hashes, [5, 6, 7, 8, 9], num_full_blocks=2, block_size=2, epoch=3)
    parent = hasher.root(3)
    for index, (key, digest) in enumerate(zip(keys, hashes, strict=True)):
        block = [5, 6, 7, 8][2 * index : 2 * index + 2]
        assert key == (parent, tuple(block))
        expected = hashlib.blake2b(
            parent + array("q", block).tobytes(), digest_size=DIGEST_BYTES, key=KEY
        ).digest()
        assert digest == expected
        parent = digest


def test_the_chain_depends_on_the_whole_prefix_the_epoch_and_the_key():
    def chain(tokens: list[int], epoch: int = 0, key: bytes = KEY) -> list[bytes]:
        hashes: list[bytes] = []
        BlockHasher(key).extend(hashes, tokens, len(tokens) // 2, 2, epoch)
        return hashes

    base = chain([1, 2, 3, 4])
    assert chain([9, 2, 3, 4])[1] != base[1]  # same last block, other parent
    assert chain([1, 2, 3, 4], epoch=1) != base
    assert chain([1, 2, 3, 4], key=bytes(DIGEST_BYTES)) != base
    # Ids wider than 32 bits keep their own bytes (no two lists share an encoding).
    assert chain([1, 2**32 + 2]) != chain([1, 2])


def test_each_block_manager_draws_its_own_secret_key():
    first, second = BlockManager(8, 2), BlockManager(8, 2)
    assert first.hasher.root(0) != second.hasher.root(0)
