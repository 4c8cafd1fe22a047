"""Grades lab 05_concat_cache over a run of speculative steps (append a block, crop to the kept part): the keys
must always be the kept positions in order, every append must move the cache (a new tensor), every crop keep
it where it is (a view)."""

import torch

from _lab_helpers import drawn_generator

BLOCK = 16


def test_concat_cache(lab):
    generator = drawn_generator()
    start = torch.randn(1, 2, 8, 64, generator=generator)  # (1, kv heads, 8 positions, head_dim)
    cache, kept = lab.ConcatCache(start), [start]  # kept: the positions the cache should hold, chunk by chunk
    accepted = torch.randint(1, BLOCK + 1, (5,), generator=generator).tolist()  # kept per step
    for keep in accepted:
        block = torch.randn(1, 2, BLOCK, 64, generator=generator)
        before = cache.keys
        cache.append(block)
        grown = cache.keys
        length = sum(chunk.shape[2] for chunk in kept)
        assert grown.shape == (1, 2, length + BLOCK, 64), (
            f"05_concat_cache: after appending a block of {BLOCK} positions the keys are "
            f"{tuple(grown.shape)}")
        assert grown.data_ptr() != before.data_ptr(), "05_concat_cache: torch.cat makes a new tensor: the cache moves"
        cache.crop(length + keep)
        assert cache.keys.data_ptr() == grown.data_ptr(), \
            "05_concat_cache: a crop by slicing is a view: the same memory"
        kept.append(block[:, :, :keep])
        assert torch.equal(cache.keys, torch.cat(kept, dim=2)), \
            "05_concat_cache: the keys should be the kept positions, in order"
