"""Lab 01_interleaved_rope (notebook 1, section 3): interleaved (GPT-J) RoPE.

Write the function below, then grade it: python -m pytest tutorials/labs -k interleaved_rope
Then, in notebook 1, swap it into the model and see whether a split-half checkpoint notices.
"""

import torch


def interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by the angle of pair i; x (..., seq, head_dim), cos/sin (seq, head_dim).

    `cos` and `sin` come as `RotaryEmbedding` makes them for `apply_rope`, laid out split-half: the first
    head_dim/2 columns hold pair i's angle in column i (and again in column i + head_dim/2). The interleaved
    pairing wants pair i's angle at columns 2i and 2i + 1.
    """
    raise NotImplementedError
