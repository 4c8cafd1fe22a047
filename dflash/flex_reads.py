"""A KV cache that compiled passes read through FlexAttention, visiting only its filled key blocks.

A compiled pass reads the whole static buffer to keep its shapes fixed: plain attention loads every
key up to `max_length`. FlexAttention's *block mask* lists, per query block, the key blocks to visit:
here those up to the last key any query may see, counted on the device from the position mask (no
host sync). Opt-in (`ModelRunner(flex_attention=True)`, `--flex-attention`): the runner's passes then
build their attention with `filled_blocks` instead of `masked`.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from dflash.qwen3 import Attend, masked


class FilledBlocks:
    """A position mask (batch or 1, 1, seq or 1, keys) or (seq or 1, keys) as FlexAttention's block mask."""

    QUERY_BLOCK = KEY_BLOCK = 128

    def __init__(self, mask: torch.Tensor):
        self.mask = mask  # True where a query may look
        self.built = None  # the block mask, built by the first layer and shared by the others

    def block_mask(self, batch: int, seq: int, keys: int):
        """One query block, the key blocks 0..last visible, the dense mask inside them."""
        dense = self.mask if self.mask.dim() == 4 else self.mask[None, None]  # (batch or 1, 1, seq or 1, keys)
        dense = dense[:, 0].expand(batch, seq, keys)  # (batch, seq, keys), a view
        key_index = torch.arange(keys, device=dense.device)
        last_visible = torch.where(dense.any(dim=1), key_index, 0).amax(dim=1)  # (batch,)
        num_blocks = (last_visible // self.KEY_BLOCK + 1).to(torch.int32)  # (batch,): the filled part, in blocks
        all_blocks = torch.arange(-(-keys // self.KEY_BLOCK), device=dense.device, dtype=torch.int32)
        return BlockMask.from_kv_blocks(  # shapes (batch, heads=1, query blocks=1) and (..., key blocks)
            num_blocks.view(batch, 1, 1), all_blocks.expand(batch, 1, 1, -1).contiguous(),
            BLOCK_SIZE=(self.QUERY_BLOCK, self.KEY_BLOCK), seq_lengths=(seq, keys),
            mask_mod=lambda b, h, query, key: dense[b, query, key])

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (batch, heads, seq, d) over k, v (batch, kv_heads, keys, d) -> (batch, heads, seq, d)."""
        if self.built is None:
            self.built = self.block_mask(q.shape[0], q.shape[2], k.shape[2])  # batch, queries, keys
        return flex_attention(q, k, v, block_mask=self.built, enable_gqa=True)


def filled_blocks(mask: torch.Tensor) -> Attend:
    """Attention under `mask` that visits only the filled key blocks, where that pays: in a compiled pass
    of at most `QUERY_BLOCK` queries FlexAttention becomes one fused kernel; elsewhere plain `masked`."""
    queries = mask.shape[-2]
    if queries <= FilledBlocks.QUERY_BLOCK and torch.compiler.is_compiling():
        return FilledBlocks(mask).attend
    return masked(mask)
