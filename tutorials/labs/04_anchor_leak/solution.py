"""Lab 04_anchor_leak, the reference answer (notebook 4, section 3): a block that sees past its anchor."""

import torch

from dflash.train_kernels import AnchoredBlocks


def leaky_pattern(anchors: torch.Tensor, context_length: int, block_size: int, extra: int):
    """AnchoredBlocks, but block j also sees the context positions a_j .. a_j + extra - 1.

    AnchoredBlocks lets block j see c < a_j and nothing else depends on the anchors' values (its
    own block is found by index), so anchors moved right by `extra` give c < a_j + extra; the
    clamp keeps larger shifts inside the context.
    """
    return AnchoredBlocks((anchors + extra).clamp(max=context_length), context_length, block_size)
