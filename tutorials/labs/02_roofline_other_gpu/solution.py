"""Lab 02_roofline_other_gpu, the reference answer (notebook 2, section 1): the roofline of a pass on another GPU."""

H100 = dict(name="NVIDIA H100 SXM", bandwidth=3.35e12, flops=989e12)  # bytes/s, dense bf16 FLOP/s (datasheets)
A100 = dict(name="NVIDIA A100 SXM 80GB", bandwidth=2.039e12, flops=312e12)


def pass_ms(gpu: dict, k: int, counts) -> float:
    """The roofline time of one pass over k new tokens: the slower of reading and computing, in ms."""
    return 1e3 * max(counts.bytes_read(k) / gpu["bandwidth"], counts.flops(k) / gpu["flops"])


def flat_until(gpu: dict, counts, limit: float = 1.10) -> int:
    """The largest k (1..1024) whose pass costs at most `limit` times a one-token pass."""
    one = pass_ms(gpu, 1, counts)
    return max(k for k in range(1, 1025) if pass_ms(gpu, k, counts) <= limit * one)
