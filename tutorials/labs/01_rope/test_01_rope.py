"""Grades lab 01_rope: against RotaryEmbedding + apply_rope (both switched off while the student's
function runs: it computes the angles itself), the relative-position property, then inside the demo
target: every attention layer rotates with the student's function, and the plain loop must still
write its tokens."""

import contextlib
from unittest import mock

import torch

import dflash.qwen3
from _lab_helpers import drawn_generator, forbidden, plain_loop
from dflash.qwen3 import RotaryEmbedding, apply_rope

THETAS = (1e4, 1e6)
RULE = "01_rope: the lab asks for the frequencies, angles and rotation from the formula"
PROJECT_ROPE = {dflash.qwen3: ["RotaryEmbedding", "apply_rope"]}


def positions_as_rope(self, positions, dtype):
    """RotaryEmbedding.forward's stand-in: hands the positions and theta on, as (..., seq, 1) columns, to
    `apply_rope`, so that the student's function computes the angles itself. The drafter slices them by row."""
    column = positions.float()[..., None]  # (seq, 1)
    return column, torch.full_like(column, self.theta)


@contextlib.contextmanager
def plugged_in(my_rope):
    """The model with `my_rope` doing every rotation, angles included: from the moment the block is
    entered, not before (the plain loop's tokens are computed first, with the project's RoPE)."""
    def rotate(x, positions, theta):  # x (batch, heads, seq, head_dim); positions, theta (seq, 1)
        assert positions.dim() == 2, "the demo runs one sequence: positions (seq,)"
        return my_rope(x, positions[:, 0], theta[0, 0].item())

    with mock.patch.object(RotaryEmbedding, "forward", positions_as_rope), \
            mock.patch.object(dflash.qwen3, "apply_rope", rotate):
        yield


def test_rope(lab, demo):
    generator = drawn_generator()
    for head_dim, theta in ((64, 1e6), (32, 1e4), (128, 1e6)):
        seq = int(torch.randint(3, 12, (1,), generator=generator))
        x = torch.randn(1, 4, seq, head_dim, generator=generator)  # (batch, heads, seq, head_dim)
        # (seq,): positions drawn
        start = torch.randint(0, 1024, (seq,), generator=generator).sort().values
        for at in (torch.arange(seq), start):
            cos, sin = RotaryEmbedding(head_dim, theta)(at, x.dtype)  # (seq, head_dim) each
            expected = apply_rope(x, cos, sin)
            with forbidden(lab, RULE, PROJECT_ROPE):
                mine = lab.my_rope(x, at, theta)
            assert torch.allclose(mine, expected, atol=5e-4), (
                f"01_rope: differs from RotaryEmbedding + apply_rope at positions {at.tolist()}, "
                f"theta {theta:g}"
            )
    offset = int(torch.randint(1, 9, (1,), generator=generator))
    q, k = torch.randn(2, 1, 1, 1, 64, generator=generator).unbind(0)  # (1, 1, 1, head_dim) each
    dots = [
        (lab.my_rope(q, torch.tensor([m]), 1e6) * lab.my_rope(k, torch.tensor([m - offset]), 1e6))
        .sum()
        .item()
        for m in (offset, 50, 700)
    ]
    assert max(dots) - min(dots) < 1e-3, \
        f"01_rope: q . k should depend only on the offset ({offset} here)"
    demo.assert_plugged_in_matches(plugged_in(lab.my_rope), plain_loop(demo),
                                   "01_rope: with your RoPE in every attention layer")
