"""Lab 04_anchor_leak (notebook 4, section 3): an attention pattern that lets a training block
see past its anchor. Notebook 4 then trains with it and measures what each leak does.

Write the function below, then grade it: python -m pytest tutorials/labs -k anchor_leak
"""

import torch  # noqa: F401

from dflash.train_kernels import AnchoredBlocks  # noqa: F401  (train.py's pattern)


def leaky_pattern(anchors: torch.Tensor, context_length: int, block_size: int, extra: int):
    """`AnchoredBlocks`, but block j also sees the context positions a_j .. a_j + extra - 1: c < a_j + extra.

    anchors (batch, K), sorted along each row; the result must work wherever train.py uses an
    AnchoredBlocks (its `dense_mask()` and its `attend`). With extra = 1 a block sees its anchor's own
    position (<= instead of <); with extra = block_size, the target's features at every position it must
    guess. Hint: what does AnchoredBlocks compute from `anchors`? Keep every block inside the context.
    """
    raise NotImplementedError
