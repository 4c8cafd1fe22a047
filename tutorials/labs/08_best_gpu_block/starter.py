"""Lab 08_best_gpu_block (notebook 8, section 5; about 10 minutes): the best block size on a GPU, by the roofline
model.

Write the function below, then grade it: python -m pytest tutorials/labs -k best_gpu_block
"""


def best_gpu_block(gpu_speedup, gpu: str, alpha: float) -> int:
    """The block size from 2 to 512 with the highest modelled speedup `gpu_speedup(gpu, alpha, block)` (notebook 8's
    section 5: "H100 SXM" or "H200", a constant per-slot acceptance alpha).

    Then, in notebook 8: compare with the best block on the CPU, and explain with section 4's rule: what are
    p_B / tau(B) and dt / t_step at the GPU's optimum?
    """
    raise NotImplementedError
