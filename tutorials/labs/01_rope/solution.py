"""Lab 01_rope, the reference answer (notebook 1, section 3): split-half RoPE from the formula."""

import torch


def my_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (batch, heads, seq, head_dim) at positions (seq,) -> the same shape, pairs (x_i, x_{i+d/2}) rotated."""
    d = x.shape[-1]
    omega = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,): omega_i = theta^(-2i/d)
    angles = positions.float()[:, None] * omega[None, :]  # (seq, d/2)
    cos, sin = angles.cos(), angles.sin()  # (seq, d/2) each
    first, second = x[..., : d // 2], x[..., d // 2:]  # (batch, heads, seq, d/2) each: the two halves of every pair
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)  # (batch, heads, seq, d)
