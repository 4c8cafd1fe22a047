"""Lab 05_concat_cache (notebook 5, section 4; a warm-up): a concatenating KV cache, to see why the
project's is static. (Timing it against the static one is notebook 5's part.)

Write the two methods below, then grade them: python -m pytest tutorials/labs -k concat_cache
"""

import torch  # noqa: F401


class ConcatCache:
    """One layer's keys, grown by torch.cat and cropped by slicing (values alike, left out)."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys  # (batch, kv_heads, length, head_dim)

    def append(self, new_keys: torch.Tensor) -> None:
        """self.keys followed by new_keys (batch, kv_heads, new, head_dim), along the positions, with torch.cat."""
        raise NotImplementedError

    def crop(self, length: int) -> None:
        """Keep the first `length` positions, by slicing: does that copy anything?"""
        raise NotImplementedError
