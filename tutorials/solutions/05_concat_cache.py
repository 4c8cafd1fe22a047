"""Notebook 5, exercise 2: a concatenating KV cache, timed against the static one.

A speculative step appends (or writes) a block of 16 positions in every layer, then cuts the
cache back to the accepted part. The concatenating cache's crop is a slice, a view: free. Its
append is a torch.cat, which allocates a new tensor and copies the whole cache into it, so its
step grows with the cache's length and the cache moves. The static cache writes 16 positions
in place and moves one integer, at any length.

Run from tutorials/: python solutions/05_concat_cache.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.qwen3 import KVCache

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
LAYERS, KV_HEADS, HEAD_DIM, B, KEEP = 4, 8, 128, 16, 7  # Qwen3-8B's kv heads in 4 layers; keep 7 of 16


class ConcatCache:
    """One layer's keys, grown by torch.cat and cropped by slicing."""

    def __init__(self, keys):
        self.keys = keys  # (batch, kv_heads, length, head_dim)

    def append(self, new_keys):
        self.keys = torch.cat([self.keys, new_keys], dim=2)  # a new tensor: the whole cache is copied

    def crop(self, length):
        self.keys = self.keys[:, :, :length]  # a view: nothing is copied


# The notebook's checks.
concat = ConcatCache(torch.randn(1, 2, 8, 64))
before = concat.keys
concat.append(torch.randn(1, 2, B, 64))
grown = concat.keys
concat.crop(8 + 3)
assert grown.shape[2] == 8 + B and concat.keys.shape[2] == 11
assert concat.keys.data_ptr() == grown.data_ptr(), "a crop is a view: the same memory"
assert grown.data_ptr() != before.data_ptr(), "an append allocates a new tensor: the cache moves"


def step_ms(design, length, repeats=15):
    """The fastest of `repeats` speculative steps at `length` cached tokens, in ms; keys and values alike."""
    new = torch.randn(1, KV_HEADS, B, HEAD_DIM)  # (1, kv heads, B, head_dim): one block's keys (and values)
    if design == "concat":
        caches = [ConcatCache(torch.randn(1, KV_HEADS, length, HEAD_DIM)) for _ in range(2 * LAYERS)]  # keys, values
    else:
        static = KVCache(LAYERS, 1, KV_HEADS, length + B, HEAD_DIM)
        static.extend(length)
        slots = torch.arange(length, length + B)  # (B,): where the block goes
    best, addresses = float("inf"), set()
    for _ in range(repeats):
        began = time.perf_counter()
        if design == "concat":
            for cache in caches:
                cache.append(new)
                cache.crop(length + KEEP)
        else:
            for layer in range(LAYERS):
                static.write(layer, slots, new, new)
            static.extend(KEEP)  # commit the kept part of the block: the rest is never committed
        best = min(best, time.perf_counter() - began)
        if design == "concat":
            addresses.add(caches[0].keys.data_ptr())
            for cache in caches:
                cache.crop(length)  # back to where the step began, for the next repeat
        else:
            addresses.add(static.keys[0].data_ptr())
            static.trim(length)
    return 1e3 * best, len(addresses)


results = {}
for design in ("static", "concat"):
    for length in (256, 4096):
        results[design, length] = step_ms(design, length)
        milliseconds, places = results[design, length]
        print(f"{design:6} cache, {length:4} tokens: {milliseconds:6.3f} ms a step; the layer-0 keys lived at "
              f"{places} address(es) over the repeats")
static_small, static_large = results["static", 256][0], results["static", 4096][0]
concat_small, concat_large = results["concat", 256][0], results["concat", 4096][0]
print(f"from 256 to 4096 tokens the concatenating step grew {concat_large / concat_small:.1f}x, the static one "
      f"{static_large / static_small:.1f}x; at 4096 tokens the concatenating step costs "
      f"{concat_large / static_large:.0f}x the static one")
# Timings are printed, not asserted (on a busy machine they may come out otherwise); where the keys live is not.
grows, dwarfs = concat_large > 3 * concat_small, concat_large > 5 * static_large
print(f"the concatenating step grows with the cache (it copies it): {'yes' if grows else 'not on this run'}; "
      f"at a long context the copy dwarfs the static write: {'yes' if dwarfs else 'not on this run'}")
assert results["static", 4096][1] == 1 and results["concat", 4096][1] > 1, "static buffers stay put; appends move"
print("checks passed")
