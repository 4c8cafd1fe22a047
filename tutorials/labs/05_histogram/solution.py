"""Lab 05_histogram, the reference answer (notebook 5, section 3): tau and per-slot acceptance from the histogram."""


def tau_from_histogram(histogram: list[int]) -> float:
    """histogram[i] steps committed i + 1 tokens: the mean step length."""
    return sum((i + 1) * count for i, count in enumerate(histogram)) / sum(histogram)


def per_slot_from_histogram(histogram: list[int]) -> list[float | None]:
    """For draft slot k = 1..B-1: a step of length L reached slot k when L >= k, and kept it when L > k."""
    rates = []
    for slot in range(1, len(histogram)):
        reached = sum(histogram[slot - 1:])  # lengths slot .. B
        kept = sum(histogram[slot:])  # lengths slot + 1 .. B
        rates.append(kept / reached if reached else None)
    return rates
