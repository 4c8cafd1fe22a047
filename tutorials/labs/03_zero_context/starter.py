"""Lab 03_zero_context (notebook 3, section 2; a warm-up): the drafter without the target's
features.

Write the function below, then grade it: python -m pytest tutorials/labs -k zero_context
"""

import torch  # noqa: F401

from generate import ModelRunner  # noqa: F401  (the runner to subclass)


def tau_without_context(pair, pooled_tau) -> float:
    """The pooled tau of the DFlash loop when the drafter sees zeros instead of the target's features.

    A warm-up: its answer is short; the point is the number it gives. The drafter's passes must see
    nothing of the target's features (the loop itself unchanged: the target still verifies).
    `ModelRunner` runs the passes, and its `draft` is where the features reach the drafter.
    `pooled_tau(runner_class)` runs the loop over held-out prompts with a fresh runner of the class
    you give it and returns the pooled tau: return what it gives for yours. `pair` (the demo pair:
    target, drafter, tokenizer, block) is there if you want to look at the drafts."""
    raise NotImplementedError
