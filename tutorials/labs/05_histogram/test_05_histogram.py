"""Grades lab 05_histogram against the project's statistics computed from the step lengths themselves
(Generation.mean_acceptance, per_position_acceptance), on many random lists of lengths, a few of them short
enough that late slots are never reached; the student's functions see only each list's histogram."""

import math

import torch

from _lab_helpers import drawn_generator
from dflash.results import Generation, acceptance_histogram, per_position_acceptance


def random_lengths(generator: torch.Generator, block: int) -> list[int]:
    steps = int(torch.randint(1, 40, (1,), generator=generator))
    longest = int(torch.randint(1, block + 1, (1,), generator=generator))  # some lists never reach the late slots
    return torch.randint(1, longest + 1, (steps,), generator=generator).tolist()


def test_histogram(lab):
    generator = drawn_generator()
    for trial in range(200):
        block = (4, 8, 16)[trial % 3]
        lengths = random_lengths(generator, block)
        histogram = acceptance_histogram(lengths, block)
        tau = lab.tau_from_histogram(list(histogram))
        assert math.isclose(tau, Generation([], lengths, 0.0).mean_acceptance, rel_tol=1e-12), \
            f"05_histogram: tau {tau} from {list(histogram)} is not the steps' mean length"
        mine, expected = lab.per_slot_from_histogram(list(histogram)), per_position_acceptance(lengths, block)
        assert len(mine) == block - 1, f"05_histogram: one rate per draft slot 1..{block - 1}, got {len(mine)}"
        for slot, (a, b) in enumerate(zip(mine, expected), start=1):
            assert (a is None) == (b is None) and (
                b is None or math.isclose(a, b, rel_tol=1e-12)
            ), (
                f"05_histogram: slot {slot} of {list(histogram)}: {a} is not the share of the "
                "steps reaching slot "
                f"{slot} that kept it{' (no step reached it)' if b is None else ''}"
            )
