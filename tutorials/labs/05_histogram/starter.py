"""Lab 05_histogram (notebook 5, section 3): tau and the per-slot acceptance from the
acceptance histogram alone.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k histogram
"""


def tau_from_histogram(histogram: list[int]) -> float:
    """The mean step length; histogram[i] steps committed i + 1 tokens (bonus included)."""
    raise NotImplementedError


def per_slot_from_histogram(histogram: list[int]) -> list[float | None]:
    """For draft slots k = 1 .. B-1 (B = len(histogram)): the share of the steps that reached slot k
    which kept its draft; None where no step reached slot k. Which step lengths reach a slot, and
    which keep it?"""
    raise NotImplementedError
