"""Notebook 1, exercise 2: split-half RoPE from the formula, checked against RotaryEmbedding + apply_rope.

Run from tutorials/: python solutions/01_rope.py
"""

import json
import sys
from pathlib import Path

ROOT = Path.cwd().parent  # run from tutorials/, as the notebooks are
sys.path.insert(0, str(ROOT))

import torch

from dflash.qwen3 import Qwen3Config, RotaryEmbedding, apply_rope


def my_rope(x, positions, theta):
    """x (batch, heads, seq, head_dim) at positions (seq,) -> the same shape, pairs (x_i, x_{i+d/2}) rotated."""
    d = x.shape[-1]
    omega = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,): omega_i = theta^(-2i/d)
    angles = positions.float()[:, None] * omega[None, :]  # (seq, d/2)
    cos, sin = angles.cos(), angles.sin()  # (seq, d/2) each
    first, second = x[..., : d // 2], x[..., d // 2:]  # (batch, heads, seq, d/2) each: the two halves of every pair
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)  # (batch, heads, seq, d)


torch.manual_seed(0)
config = Qwen3Config.from_dict(json.loads((ROOT / "weights/tiny-qwen3/config.json").read_text()))
x = torch.randn(1, config.num_attention_heads, 9, config.head_dim)  # (batch, heads, seq, head_dim)
at = torch.arange(100, 109)  # (seq,)
cos, sin = RotaryEmbedding(config.head_dim, config.rope_theta)(at, x.dtype)  # (seq, head_dim) each
assert torch.allclose(my_rope(x, at, config.rope_theta), apply_rope(x, cos, sin), atol=1e-5)

# The property that makes it a position encoding: q·k depends only on the offset.
q, k = torch.randn(2, 1, 1, 1, config.head_dim).unbind(0)  # (1, 1, 1, head_dim) each
dots = [(my_rope(q, torch.tensor([m]), config.rope_theta) * my_rope(k, torch.tensor([m - 3]), config.rope_theta)).sum()
        for m in (3, 50, 700)]
assert max(dots) - min(dots) < 1e-3, dots
print("exercise 2: solved")
