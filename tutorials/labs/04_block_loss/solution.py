"""Lab 04_block_loss, the reference answer (notebook 4, sections 4 and 5): labels and the decayed
loss.

Slot k of the block anchored at a sits at position a + k and is labelled x_{a+k}, the token at its
own position: the drafter fills masks in place, it does not predict the next token (a shift by one
here trains a drafter that guesses one token late, and accepts almost nothing when served). Slot 0,
the known token, has no label, nor a slot past the sequence's end, on the prompt or padding, nor a
padding block. The loss weighs slot k by exp(-(k - 1)/gamma), since slot k only counts when slots
1..k-1 were kept, and divides by the weights' sum: a weighted mean."""

import torch
import torch.nn.functional as F

IGNORE = -100


def my_block_labels(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    real: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    length = input_ids.shape[1]
    # (batch, K, B) -> (batch, K*B)
    positions = (anchors[:, :, None] + torch.arange(block_size)).flatten(1)
    inside = positions.clamp(max=length - 1)  # (batch, K*B): a place to read, even past the end
    # in the sequence, in the answer
    labelled = (positions < length) & (loss_mask.gather(1, inside) == 1)
    labelled &= (torch.arange(positions.shape[1]) % block_size != 0)[None]  # not the known token
    labelled &= real[:, :, None].expand(-1, -1, block_size).flatten(1)  # (batch, K) -> (batch, K*B)
    return torch.where(labelled, input_ids.gather(1, inside), IGNORE)  # (batch, K*B)


def my_decayed_loss(
    hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, block_size: int, gamma: float
) -> torch.Tensor:
    slot = torch.arange(labels.shape[1]) % block_size  # (K*B,): k of every slot
    weights = torch.exp(-(slot - 1) / gamma) * (labels != IGNORE)  # (batch, K*B): 0 where no label
    logits = (hidden @ head.T).float()  # (batch, K*B, vocab)
    # (batch*K*B,)
    losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten().clamp(min=0), reduction="none")
    return (weights.flatten() * losses).sum() / weights.sum()
