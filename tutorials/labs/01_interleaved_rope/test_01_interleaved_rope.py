"""Grades lab 01_interleaved_rope by an independent route: the interleaved pairing is the split-half one on
reordered dimensions (even ones first, then odd ones), so the project's apply_rope on reordered x, put back in
the original order, must give the student's result. Then: a rotation, and not the split-half pairing."""

import torch

from _lab_helpers import drawn_generator
from dflash.qwen3 import RotaryEmbedding, apply_rope

HEAD_DIM = 64


def by_reordering(x, cos, sin):
    """apply_rope on x's dimensions reordered (0, 2, 4, ..., 1, 3, 5, ...), then back: pairs (2i, 2i+1) turn."""
    order = torch.cat([torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)])  # (head_dim,)
    rotated = apply_rope(x[..., order], cos, sin)  # (..., seq, head_dim), in the reordered layout
    return rotated[..., order.argsort()]  # back to x's layout


def test_interleaved_rope(lab):
    generator = drawn_generator()
    x = torch.randn(1, 2, 5, HEAD_DIM, generator=generator)  # (batch, heads, seq, head_dim)
    positions = torch.randint(0, 4096, (5,), generator=generator)  # (seq,): drawn at run time
    cos, sin = RotaryEmbedding(HEAD_DIM, 1e6)(positions, x.dtype)  # (seq, head_dim) each
    mine = lab.interleaved_rope(x, cos, sin)
    assert torch.allclose(mine.norm(dim=-1), x.norm(dim=-1), atol=1e-4), "01_interleaved_rope: a rotation keeps lengths"
    assert not torch.allclose(mine, apply_rope(x, cos, sin)), "01_interleaved_rope: this is the split-half pairing"
    assert torch.allclose(mine, by_reordering(x, cos, sin), atol=1e-5), \
        "01_interleaved_rope: pair (x[2i], x[2i+1]) should turn by pair i's angle (cos[..., i], sin[..., i])"
