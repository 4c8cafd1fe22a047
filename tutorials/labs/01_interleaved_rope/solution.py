"""Lab 01_interleaved_rope, the reference answer (notebook 1, section 3): interleaved (GPT-J) RoPE."""

import torch


def interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by the angles of pair i; x (..., seq, head_dim), cos/sin (seq, head_dim).

    cos/sin come laid out split-half (pair i's angle in columns i and i + d/2); the
    interleaved layout wants it in columns 2i and 2i + 1.
    """
    half = x.shape[-1] // 2
    cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., seq, d/2) each: the two members of every pair
    partner = torch.stack([-odd, even], dim=-1).flatten(-2)  # (..., seq, d): (-x[2i+1], x[2i]) at (2i, 2i+1)
    return x * cos + partner * sin
