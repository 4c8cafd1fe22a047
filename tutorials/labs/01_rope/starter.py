"""Lab 01_rope (notebook 1, section 3): split-half RoPE from the formula.

Write the function below, then grade it: python -m pytest tutorials/labs -k rope
"""

import torch


def my_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (batch, heads, seq, head_dim) at positions (seq,) -> the same shape, rotated.

    Compute the frequencies omega_i = theta ** (-2i / d) for i = 0 .. d/2 - 1 and the angles
    position * omega_i yourself (not with RotaryEmbedding), and rotate every pair (x_i, x_{i + d/2})
    by its angle. The grader compares with RotaryEmbedding + apply_rope, checks that q . k depends only
    on the offset of their positions, then runs the demo pair with your function in every attention layer.
    """
    raise NotImplementedError
