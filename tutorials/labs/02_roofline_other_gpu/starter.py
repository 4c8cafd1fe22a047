"""Lab 02_roofline_other_gpu (notebook 2, section 1): the roofline time of a Qwen3-8B pass
on another GPU, and how many tokens a verify pass checks "for free" there.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k roofline_other_gpu
"""

H100 = dict(name="NVIDIA H100 SXM", bandwidth=3.35e12, flops=989e12)  # bytes/s, dense bf16 FLOP/s (datasheets)
A100 = dict(name="NVIDIA A100 SXM 80GB", bandwidth=2.039e12, flops=312e12)


def pass_ms(gpu: dict, k: int, counts) -> float:
    """The roofline time, in milliseconds, of one pass over `k` new tokens on `gpu` (its `bandwidth` in bytes/s
    and peak `flops` per second). `counts.bytes_read(k)` and `counts.flops(k)` are notebook 2's counts for
    Qwen3-8B. A pass cannot beat the time to read its bytes, nor the time to do its FLOPs: which one bounds it?
    """
    raise NotImplementedError


def flat_until(gpu: dict, counts, limit: float = 1.10) -> int:
    """The largest k in 1..1024 whose pass costs at most `limit` times a one-token pass (use your pass_ms)."""
    raise NotImplementedError
