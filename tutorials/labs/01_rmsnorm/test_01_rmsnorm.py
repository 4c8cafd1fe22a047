"""Grades lab 01_rmsnorm: against dflash.qwen3.RMSNorm in float32, then bit for bit in bfloat16 and float16,
then inside the demo pair: every RMSNorm of the target and the drafter computed by the student's function."""

import copy
from unittest import mock

import torch

from _lab_helpers import dflash_loop
from dflash.qwen3 import RMSNorm


def test_rmsnorm(lab, demo):
    torch.manual_seed(0)
    reference = RMSNorm(256, 1e-6)
    reference.weight.data = 1 + 0.1 * torch.randn(256)  # not all ones, so the weight matters
    x = 3 * torch.randn(2, 5, 256)  # (batch, seq, hidden)
    with torch.no_grad():
        assert torch.allclose(lab.my_rms_norm(x, reference.weight, reference.eps), reference(x), atol=1e-5), \
            "01_rmsnorm: differs from RMSNorm in float32"
        for dtype in (torch.bfloat16, torch.float16):
            low = copy.deepcopy(reference).to(dtype)
            mine = lab.my_rms_norm(x.to(dtype), low.weight, low.eps)
            assert mine.dtype == dtype, f"01_rmsnorm: on {dtype} input the result should be {dtype}, not {mine.dtype}"
            assert torch.equal(mine, low(x.to(dtype))), \
                f"01_rmsnorm: not bit for bit RMSNorm's on {dtype} input (where does your arithmetic happen?)"

    def norm(self, x):
        return lab.my_rms_norm(x, self.weight, self.eps)

    demo.assert_plugged_in_matches(mock.patch.object(RMSNorm, "forward", norm), dflash_loop(demo),
                                   "01_rmsnorm: with your RMSNorm in every layer")
