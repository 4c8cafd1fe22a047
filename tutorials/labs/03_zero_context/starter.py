"""Lab 03_zero_context (notebook 3, section 2; about 15 minutes): the drafter without the target's features.

Write the function below, then grade it: python -m pytest tutorials/labs -k zero_context
"""

import torch  # noqa: F401

from generate import ModelRunner  # noqa: F401  (the runner to subclass)


def tau_without_context(pair, pooled_tau) -> float:
    """The pooled tau of the DFlash loop when the drafter sees zeros instead of the target's features.

    Write a `ModelRunner` subclass whose `draft(context_features, *args, **kwargs)` passes
    `torch.zeros_like(context_features)` on to `ModelRunner.draft`, and return `pooled_tau(YourRunner)`:
    `pooled_tau` runs the loop over held-out prompts with a fresh runner of the class you give it.
    `pair` (the demo pair: target, drafter, tokenizer, block) is there if you want to look at the drafts.
    """
    raise NotImplementedError
