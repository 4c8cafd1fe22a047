"""Grades lab 01_rmsnorm: against dflash.qwen3.RMSNorm in float32, then bit for bit in bfloat16 and
float16, then inside the demo target: every RMSNorm computed by the student's function, the plain
loop must still write its tokens. The inputs are drawn at run time, and some rows have an RMS near
sqrt(eps), where eps changes the answer. The project's RMSNorm (and torch's rms_norm) are switched
off while the student's function runs on its own."""

import copy
from unittest import mock

import torch
import torch.nn.functional as F

import dflash.qwen3
from _lab_helpers import drawn_generator, forbidden, plain_loop
from dflash.qwen3 import RMSNorm

RULE = "01_rmsnorm: the lab asks for RMSNorm from its formula"
PROJECT_NORMS = {dflash.qwen3: ["RMSNorm"], F: ["rms_norm"], torch: ["rms_norm"]}


def drawn_input(generator: torch.Generator, dim: int, eps: float) -> torch.Tensor:
    """(2, 6, dim): rows of RMS about 3, about 1, and about sqrt(eps), where leaving eps out
    shows."""
    x = torch.randn(2, 6, dim, generator=generator)
    scales = torch.tensor([3.0, 1.0, eps**0.5, 3 * eps**0.5, 0.5, 1e-3])  # (6,): one per position
    return x * scales[:, None]


def test_rmsnorm(lab, demo):
    generator = drawn_generator()
    for dim, eps in ((256, 1e-6), (int(torch.randint(16, 200, (1,), generator=generator)), 1e-5)):
        reference = RMSNorm(dim, eps)
        # not all ones: the weight matters
        reference.weight.data = 1 + 0.1 * torch.randn(dim, generator=generator)
        x = drawn_input(generator, dim, eps)  # (batch, seq, dim)
        with torch.no_grad():
            expected = reference(x)
            with forbidden(lab, RULE, PROJECT_NORMS):
                mine = lab.my_rms_norm(x, reference.weight, reference.eps)
            assert torch.allclose(mine, expected, atol=1e-5, rtol=1e-4), (
                "01_rmsnorm: differs from RMSNorm in float32 (look at the rows whose RMS is near "
                "sqrt(eps))"
            )
            for dtype in (torch.bfloat16, torch.float16):
                low = copy.deepcopy(reference).to(dtype)
                expected = low(x.to(dtype))
                with forbidden(lab, RULE, PROJECT_NORMS):
                    mine = lab.my_rms_norm(x.to(dtype), low.weight, low.eps)
                assert mine.dtype == dtype, (
                    f"01_rmsnorm: on {dtype} input the result should be {dtype}, not {mine.dtype}"
                )
                assert torch.equal(mine, expected), (
                    f"01_rmsnorm: not bit for bit RMSNorm's on {dtype} input (where does your "
                    "arithmetic happen?)"
                )

    def norm(self, x):
        return lab.my_rms_norm(x, self.weight, self.eps)

    demo.assert_plugged_in_matches(mock.patch.object(RMSNorm, "forward", norm), plain_loop(demo),
                                   "01_rmsnorm: with your RMSNorm in every layer")
