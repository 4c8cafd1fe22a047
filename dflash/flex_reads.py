"""A KV cache that compiled passes read through FlexAttention, visiting only its filled key blocks.

A compiled pass reads the whole static buffer so that its shapes never change; with
plain attention that means loading every key and value up to `max_length`, however
little of the buffer is filled. FlexAttention takes a *block mask*: for each block of
queries, the key blocks worth visiting. Here that list is the key blocks up to the
last key any query may see, counted on the device from the position mask itself (no
host sync, fixed shapes), and the mask decides inside them. Opt-in
(`ModelRunner(flex_attention=True)`, `--flex-attention`): exact everywhere, but not
yet measured on a GPU, where it is meant to pay.
"""

from __future__ import annotations

import torch

from dflash.qwen3 import KVCache, attend


class FilledBlocks:
    """A position mask (batch or 1, 1, seq or 1, keys) or (seq or 1, keys) as FlexAttention's block mask."""

    QUERY_BLOCK = KEY_BLOCK = 128

    def __init__(self, mask: torch.Tensor):
        self.mask = mask  # True where a query may look
        self.built = None  # the block mask, built by the first layer and shared by the others

    def block_mask(self, batch: int, seq: int, keys: int):
        """One query block, the key blocks 0..last visible, the dense mask inside them."""
        from torch.nn.attention.flex_attention import BlockMask

        dense = self.mask if self.mask.dim() == 4 else self.mask[None, None]  # (batch or 1, 1, seq or 1, keys)
        dense = dense[:, 0].expand(batch, seq, keys)  # (batch, seq, keys), a view
        key_index = torch.arange(keys, device=dense.device)
        last_visible = torch.where(dense.any(dim=1), key_index, 0).amax(dim=1)  # (batch,)
        num_blocks = (last_visible // self.KEY_BLOCK + 1).to(torch.int32)  # (batch,): the filled part, in blocks
        all_blocks = torch.arange(-(-keys // self.KEY_BLOCK), device=dense.device, dtype=torch.int32)

        def visible(b, h, query, key):
            return dense[b, query, key]

        return BlockMask.from_kv_blocks(  # shapes (batch, heads=1, query blocks=1) and (..., key blocks)
            num_blocks.view(batch, 1, 1), all_blocks.expand(batch, 1, 1, -1).contiguous(),
            BLOCK_SIZE=(self.QUERY_BLOCK, self.KEY_BLOCK), mask_mod=visible, seq_lengths=(seq, keys))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (batch, heads, seq, d) over k, v (batch, kv_heads, keys, d) -> (batch, heads, seq, d)."""
        from torch.nn.attention.flex_attention import flex_attention

        batch, _, seq, _ = q.shape
        if self.built is None:
            self.built = self.block_mask(batch, seq, k.shape[2])
        return flex_attention(q, k, v, block_mask=self.built, enable_gqa=True)


class FilledBlocksCache(KVCache):
    """A `KVCache` whose compiled passes of at most `QUERY_BLOCK` queries attend through `FilledBlocks`.

    Only there: the compiler turns FlexAttention into one fused kernel. An eager pass
    (the prefill) reads only the committed slots anyway, and plain masked attention
    is exact with no kernel compiled per shape.
    """

    def prepare(self, mask: torch.Tensor, seq: int):
        if seq <= FilledBlocks.QUERY_BLOCK and torch.compiler.is_compiling():
            return FilledBlocks(mask)
        return mask

    def attend(self, q, k, v, prepared) -> torch.Tensor:
        return prepared.attend(q, k, v) if isinstance(prepared, FilledBlocks) else attend(q, k, v, prepared)
