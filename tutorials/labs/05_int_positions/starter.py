"""Lab 05_int_positions (notebook 5, section 5): what torch.compile does with a Python int
that changes at every step.

Write the function below, then grade it: python -m pytest tutorials/labs -k int_positions
"""

import torch  # noqa: F401


def graphs_with_int_positions(target, counter, steps: int = 4) -> list[int]:
    """The graph count (`counter.graphs`) after each of `steps` compiled decode steps of `target`.

    Rebuild notebook 5's `decode_steps(True)` (a fixed-shape cache of 32 slots, an eager prefill of
    three ids, then `steps` greedy decode steps through one compiled step function), with one
    change: the step takes its position as a Python int, and makes the positions tensor itself.
    Compile with `torch.compile(..., backend=counter, dynamic=False, fullgraph=True)`, after
    `torch.compiler.reset()`. Predict the counts before you run it, and explain them."""
    raise NotImplementedError
