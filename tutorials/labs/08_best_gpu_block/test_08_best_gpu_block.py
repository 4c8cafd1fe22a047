"""Grades lab 08_best_gpu_block by the property of a maximum: no block from 2 to 512 may do better under the model,
on both GPUs, at three acceptances."""

from _lab_helpers import gpu_speedup_model


def test_best_gpu_block(lab):
    gpu_speedup = gpu_speedup_model()
    for gpu in ("H100 SXM", "H200"):
        for alpha in (0.7, 0.8, 0.9):
            found = lab.best_gpu_block(gpu_speedup, gpu, alpha)
            assert isinstance(found, int) and 2 <= found <= 512, f"08_best_gpu_block: {found} is not a block in 2..512"
            value = gpu_speedup(gpu, alpha, found)
            better = [block for block in range(2, 513) if gpu_speedup(gpu, alpha, block) > value]
            assert not better, (f"08_best_gpu_block: {gpu}, alpha {alpha}: block {found} gives {value:.6f}x, block "
                                f"{better[0]} {gpu_speedup(gpu, alpha, better[0]):.6f}x")
