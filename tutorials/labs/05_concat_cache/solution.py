"""Lab 05_concat_cache, the reference answer (notebook 5, section 4): a concatenating KV cache.

A speculative step appends a block, then cuts the cache back to the accepted part. The crop is a
slice, a view: free. The append is a torch.cat, which allocates a new tensor and copies the whole
cache into it, so its cost grows with the cache and the cache moves at every step.
"""

import torch


class ConcatCache:
    """One layer's keys, grown by torch.cat and cropped by slicing."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys  # (batch, kv_heads, length, head_dim)

    def append(self, new_keys: torch.Tensor) -> None:
        self.keys = torch.cat([self.keys, new_keys], dim=2)  # a new tensor: the whole cache is copied

    def crop(self, length: int) -> None:
        self.keys = self.keys[:, :, :length]  # a view: nothing is copied
