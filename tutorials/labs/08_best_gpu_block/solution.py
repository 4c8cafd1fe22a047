"""Lab 08_best_gpu_block, the reference answer (notebook 8, section 5): the best block on a GPU, by
bisection.

One more slot adds alpha^B to tau, a gain that shrinks geometrically, and adds its bytes and FLOPs
to the step, a cost that never shrinks: so the speedup rises while the gain beats the cost, then
falls, and has one peak. Whether speedup(B + 1) > speedup(B) then says on which side of the peak B
lies: bisection on that comparison finds the peak in about log2(511) = 9 comparisons, 18 calls. On
the GPU, below the ridge, a slot costs only its bytes, so the peak is set by the drafter's accuracy
alone, far larger than on the CPU."""


def best_gpu_block(gpu_speedup, gpu: str, alpha: float) -> int:
    """The peak of a single-peaked speedup over 2..512, by bisection on the sign of its step."""
    low, high = 2, 512  # the peak lies in low..high
    while low < high:
        middle = (low + high) // 2
        if gpu_speedup(gpu, alpha, middle + 1) > gpu_speedup(gpu, alpha, middle):
            low = middle + 1  # still rising at middle: the peak is to the right
        else:
            high = middle  # falling (or flat) after middle: the peak is middle or to its left
    return low
