"""Lab 01_rmsnorm (notebook 1, section 2; a warm-up): RMSNorm by hand, exact on bfloat16 input too.

Write the function below, then grade it: python -m pytest tutorials/labs -k rmsnorm
"""

import torch


def my_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., dim), weight (dim,) -> (..., dim), in x's dtype.

    Divide each vector by its root-mean-square (eps added under the root), then scale by `weight`.
    It must equal `dflash.qwen3.RMSNorm` in float32, and *exactly* on bfloat16 input: bfloat16 keeps 7
    mantissa bits, so where must the arithmetic happen, and when may the result go back to x's dtype?
    Write it from the formula, not with the project's RMSNorm or torch's rms_norm: the grader
    switches them off while your function runs, then ends by running the demo pair with your
    function in every RMSNorm layer.
    """
    raise NotImplementedError
