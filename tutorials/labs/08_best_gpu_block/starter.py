"""Lab 08_best_gpu_block (notebook 8, section 5): the best block size on a GPU, by the roofline
model, found with few evaluations of the model.

Write the function below, then grade it: python -m pytest tutorials/labs -k best_gpu_block
"""


def best_gpu_block(gpu_speedup, gpu: str, alpha: float) -> int:
    """The block size from 2 to 512 with the highest modelled speedup `gpu_speedup(gpu, alpha,
    block)` (notebook 8's section 5: "H100 SXM" or "H200", a constant per-slot acceptance alpha),
    found with at most 24 calls of
    `gpu_speedup`: think of each call as a profiler run.

    Trying all 511 blocks is not allowed. What shape must the speedup have as the block grows
    (section 4's rule: what does one more slot add to tau, and to a step's cost?), and how does that
    shape let you discard half of the blocks with one comparison? Then, in notebook 8: compare with
    the best block on the CPU, and say what p_B / tau(B) and dt / t_step are at the GPU's optimum.
    """
    raise NotImplementedError
