"""Lab 03_zero_context, the reference answer (notebook 3, section 2): the drafter without the target's features."""

import torch

from generate import ModelRunner


class BlindRunner(ModelRunner):
    """A runner whose drafter sees zeros where the target's features should be."""

    def draft(self, features, *args, **kwargs):
        return super().draft(torch.zeros_like(features), *args, **kwargs)  # (block - 1, vocab)


def tau_without_context(pair, pooled_tau) -> float:
    return pooled_tau(BlindRunner)
