"""Notebook 1, exercise 1: RMSNorm by hand, exact on bfloat16 input too.

Run from tutorials/: python solutions/01_rmsnorm.py
"""

import json
import sys
from pathlib import Path

ROOT = Path.cwd().parent  # run from tutorials/, as the notebooks are
sys.path.insert(0, str(ROOT))

import torch

from dflash.qwen3 import Qwen3Config, RMSNorm


def my_rms_norm(x, weight, eps):
    """x (..., dim), weight (dim,) -> (..., dim), in x's dtype.

    Computed in float32 whatever x's dtype (bfloat16 keeps 7 mantissa bits), and rounded
    to x's dtype once, before the weight multiplies it: what the official code does, and
    so what the checkpoint was trained with.
    """
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., dim) in float32
    return weight * normed.to(x.dtype)


torch.manual_seed(0)
config = Qwen3Config.from_dict(json.loads((ROOT / "weights/tiny-qwen3/config.json").read_text()))
reference_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
reference_norm.weight.data = 1 + 0.1 * torch.randn(config.hidden_size)
x = 3 * torch.randn(2, 5, config.hidden_size)  # (batch, seq, hidden)
with torch.no_grad():
    assert torch.allclose(my_rms_norm(x, reference_norm.weight, reference_norm.eps), reference_norm(x), atol=1e-5)
    in_bf16 = reference_norm.to(torch.bfloat16)
    assert torch.equal(my_rms_norm(x.bfloat16(), in_bf16.weight, in_bf16.eps), in_bf16(x.bfloat16()))
print("exercise 1: solved")
