"""Grades lab 01_rope: against RotaryEmbedding + apply_rope, the relative-position property, then inside the
demo pair: every attention layer of the target and the drafter rotates with the student's function."""

import contextlib
from unittest import mock

import torch

import dflash.qwen3
from _lab_helpers import dflash_loop
from dflash.qwen3 import RotaryEmbedding, apply_rope

HEAD_DIM, THETA = 64, 1e6


def positions_as_rope(self, positions, dtype):
    """RotaryEmbedding.forward's stand-in: hands the positions and theta on, as (..., seq, 1) columns, to
    `apply_rope`, so that the student's function computes the angles itself. The drafter slices them by row."""
    column = positions.float()[..., None]  # (seq, 1)
    return column, torch.full_like(column, self.theta)


def plugged_in(my_rope):
    """The model with `my_rope` doing every rotation, angles included."""
    def rotate(x, positions, theta):  # x (batch, heads, seq, head_dim); positions, theta (seq, 1)
        assert positions.dim() == 2, "the demo runs one sequence: positions (seq,)"
        return my_rope(x, positions[:, 0], theta[0, 0].item())

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(RotaryEmbedding, "forward", positions_as_rope))
    stack.enter_context(mock.patch.object(dflash.qwen3, "apply_rope", rotate))
    return stack


def test_rope(lab, demo):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 9, HEAD_DIM)  # (batch, heads, seq, head_dim)
    for at in (torch.arange(9), torch.arange(100, 109), torch.tensor([0, 3, 3, 50, 51, 700, 701, 999, 1000])):
        cos, sin = RotaryEmbedding(HEAD_DIM, THETA)(at, x.dtype)  # (seq, head_dim) each
        assert torch.allclose(lab.my_rope(x, at, THETA), apply_rope(x, cos, sin), atol=1e-4), \
            f"01_rope: differs from RotaryEmbedding + apply_rope at positions {at.tolist()}"
    q, k = torch.randn(2, 1, 1, 1, HEAD_DIM).unbind(0)  # (1, 1, 1, head_dim) each
    dots = [(lab.my_rope(q, torch.tensor([m]), THETA) * lab.my_rope(k, torch.tensor([m - 3]), THETA)).sum().item()
            for m in (3, 50, 700)]
    assert max(dots) - min(dots) < 1e-3, f"01_rope: q . k should depend only on the offset (3 here), got {dots}"
    demo.assert_plugged_in_matches(plugged_in(lab.my_rope), dflash_loop(demo),
                                   "01_rope: with your RoPE in every attention layer")
