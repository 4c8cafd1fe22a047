"""Lab 08_best_gpu_block, the reference answer (notebook 8, section 5): the best block on a GPU.

On the GPU, below the FLOP-per-byte ridge, one more token in a pass costs only its bytes, so a slot pays
until the chance of keeping it, alpha^B, has fallen about as low: the best block is set by the drafter's
accuracy alone, far larger than on the CPU.
"""


def best_gpu_block(gpu_speedup, gpu: str, alpha: float) -> int:
    """The block size in 2..512 with the highest modelled speedup: a search, the model is cheap."""
    return max(range(2, 513), key=lambda block: gpu_speedup(gpu, alpha, block))
