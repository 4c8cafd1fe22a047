"""Lab 04_block_loss (notebook 4, sections 4 and 5): the training labels of anchored blocks, and the
decay-weighted loss a drafter learns from.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k block_loss
"""

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

IGNORE = -100  # the label of a slot that has none: cross_entropy's ignore_index


def my_block_labels(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    real: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The label of every slot of every block: (batch, K * block_size), IGNORE where a slot has
    none.

    input_ids (batch, S) are whole training sequences and loss_mask (batch, S) is 1 on their answer
    tokens (the text the target wrote), 0 on the prompt and the padding. Block j of row b starts at
    position anchors[b, j] (anchors (batch, K), sorted) and is laid out as in train.py: slot 0 holds
    the known token, slots 1 .. block_size - 1 are masks for the drafter to fill; blocks side by
    side along the last axis. real (batch, K) is False for padding blocks (rows with fewer anchors).
    Notebook 4 says which token each slot learns, and which slots learn nothing: think of the known
    token, the end of the sequence, the prompt, and padding."""
    raise NotImplementedError


def my_decayed_loss(
    hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, block_size: int, gamma: float
) -> torch.Tensor:
    """The drafter's training loss (a scalar tensor that backpropagates into `hidden`): the
    cross-entropy of every labelled slot, each slot weighted by the paper's decay with `gamma`
    (notebook 4, section 5: why do early slots weigh more?), as a weighted mean over the labelled
    slots.

    hidden (batch, K * block_size, dim) are the drafter's outputs; head (vocab, dim), the target's
    frozen LM head, turns them into logits; labels are my_block_labels' (IGNORE: no label, no
    weight)."""
    raise NotImplementedError
