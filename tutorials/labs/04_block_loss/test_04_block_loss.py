"""Grades lab 04_block_loss against train.py's own labels and loss, on sequences, prompts, anchors
and blocks drawn at run time: the labels token for token (a shift by one slot, a language model's
labels, is named as such), then the loss's value and its gradient with respect to the drafter's
outputs, against train.py's weights through dflash.train_kernels' dense loss. train.py's functions
and the project's loss are switched off while the student's run, and every reference is computed
before them."""

import torch

import dflash.train_kernels
import train
from _lab_helpers import drawn_generator, forbidden

RULE = "04_block_loss: the lab asks you to build the labels and the loss yourself"
FORBIDDEN = {
    train: ["block_labels", "label_weights", "slot_weights", "drafter_loss", "step_weight"],
    dflash.train_kernels: ["chunked_lm_head_loss", "ChunkedLMHeadLoss"],
}
VOCAB, DIM = 60, 24


def drawn_batch(generator: torch.Generator, block_size: int):
    """(input_ids, loss_mask, anchors, real): three sequences with a prompt, an answer and padding;
    the last row's answer is short, so that it gets fewer anchors, and padding blocks (at 0) that
    reach into it."""
    length = int(torch.randint(24, 40, (1,), generator=generator))
    input_ids = torch.randint(VOCAB, (3, length), generator=generator)  # (batch, S)
    loss_mask = torch.zeros(3, length, dtype=torch.long)  # (batch, S)
    for row, answer in enumerate((length, length - 3, 3)):
        prompt = int(torch.randint(2, 8, (1,), generator=generator)) if row < 2 else 2
        loss_mask[row, prompt : min(prompt + answer, length)] = 1
    generators = [
        torch.Generator().manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
        for _ in range(3)
    ]
    anchors, real = train.batch_anchors(loss_mask, 4, generators)  # (batch, K) each
    return input_ids, loss_mask, anchors, real


def where(index: int, block_size: int, count: int) -> str:
    block, slot = divmod(index % (count * block_size), block_size)
    return f"slot {slot} of block {block} in row {index // (count * block_size)}"


def assert_labels(mine, right, input_ids, anchors, block_size) -> None:
    assert mine.shape == right.shape, (
        f"04_block_loss: labels of shape {tuple(mine.shape)}: (batch, K * block_size)"
    )
    positions = train.block_positions(anchors, block_size)  # (batch, K*B)
    following = input_ids.gather(1, (positions + 1).clamp(max=input_ids.shape[1] - 1))  # x_{a+k+1}
    both = (mine != train.IGNORE) & (right != train.IGNORE)
    shifted = (
        both.any()
        and (mine[both] == following[both]).float().mean() > 0.9
        and not torch.equal(mine, right)
    )
    assert not shifted, (
        "04_block_loss: your labels are shifted by one slot: slot k holds the token after its own "
        "position, a language model's next-token label. A drafter trained so guesses one token "
        "late: high training accuracy, almost nothing accepted when served"
    )
    wrong = (mine != right).flatten().nonzero()
    if len(wrong):
        index, count = int(wrong[0]), anchors.shape[1]
        flat_mine, flat_right = mine.flatten(), right.flatten()
        what = (
            "has a label, and should have none"
            if flat_right[index] == train.IGNORE
            else "has no label, and should have one"
            if flat_mine[index] == train.IGNORE
            else "holds the wrong token"
        )
        raise AssertionError(
            f"04_block_loss: {where(index, block_size, count)} (anchor "
            f"{anchors.flatten()[index // block_size].item()}) {what}"
        )


def test_block_loss(lab):
    generator = drawn_generator()
    for block_size in (4, int(torch.randint(5, 17, (1,), generator=generator))):
        input_ids, loss_mask, anchors, real = drawn_batch(generator, block_size)
        right = train.block_labels(input_ids, loss_mask, anchors, real, block_size)  # (batch, K*B)
        with forbidden(lab, RULE, FORBIDDEN):
            mine = lab.my_block_labels(input_ids, loss_mask, anchors, real, block_size)
        assert_labels(torch.as_tensor(mine), right, input_ids, anchors, block_size)

        gamma = float(torch.empty(1).uniform_(2.0, 8.0, generator=generator))
        # (batch, K*B, dim): the drafter's outputs
        hidden = torch.randn(*right.shape, DIM, generator=generator)
        head = torch.randn(VOCAB, DIM, generator=generator)  # (vocab, dim): frozen
        scored = right != train.IGNORE
        weights = train.label_weights(right, train.slot_weights(block_size, gamma))[scored]  # (N,)
        reference_hidden = hidden.clone().requires_grad_()
        loss, _ = dflash.train_kernels.chunked_lm_head_loss(
            reference_hidden[scored], head, right[scored], weights / weights.sum(), 0
        )
        loss.backward()
        student_hidden = hidden.clone().requires_grad_()
        with forbidden(lab, RULE, FORBIDDEN):
            mine = lab.my_decayed_loss(student_hidden, head, right, block_size, gamma)
        assert mine.dim() == 0, (
            f"04_block_loss: the loss should be a scalar, not of shape {tuple(mine.shape)}"
        )
        assert torch.allclose(mine.detach(), loss.detach(), rtol=1e-5), (
            f"04_block_loss: your loss {mine.item():.5f} (block {block_size}, gamma {gamma:.2f}) "
            "is "
            f"{'above' if mine > loss else 'below'} the decay-weighted mean cross-entropy of the "
            "labelled slots"
        )
        mine.backward()
        assert student_hidden.grad is not None and torch.allclose(
            student_hidden.grad, reference_hidden.grad, atol=1e-6
        ), (
            "04_block_loss: the loss's value is right, its gradient with respect to the drafter's "
            "outputs is not"
        )
