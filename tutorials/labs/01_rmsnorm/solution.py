"""Lab 01_rmsnorm, the reference answer (notebook 1, section 2): RMSNorm by hand, exact on bfloat16 input too."""

import torch


def my_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., dim), weight (dim,) -> (..., dim), in x's dtype.

    Computed in float32 whatever x's dtype (bfloat16 keeps 7 mantissa bits), and rounded to x's
    dtype once, before the weight multiplies it: what the official code does, and so what the
    checkpoint was trained with.
    """
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., dim) in float32
    return weight * normed.to(x.dtype)
