"""Grades lab 06_tau_conventions on the demo pair's runs and on random step lengths: each tool's number is
computed from the step lengths as that tool counts, and the conversion must give back the project's tau."""

import math

import torch

from _lab_helpers import dflash_loop, drawn_generator
from dflash.results import Generation


def test_tau_conventions(lab, demo):
    generator = drawn_generator()
    runs = [(torch.randint(1, block + 1, (int(torch.randint(1, 30, (1,), generator=generator)),),
                           generator=generator).tolist(), block) for block in (2, 4, 8, 16) for _ in range(20)]
    loop = dflash_loop(demo)
    runs += [(loop(ids, choices, limit).acceptance_lengths, demo.block)
             for (ids, choices), limit in zip(demo.prompts(2), (96, 20))]
    for lengths, block in runs:
        tau = Generation([], lengths, 0.0).mean_acceptance  # the project's tau: tokens per step, bonus included
        drafts_kept = [length - 1 for length in lengths]
        mean_drafts = sum(drafts_kept) / len(lengths)  # a tool that leaves the bonus out
        rate = sum(drafts_kept) / (len(lengths) * (block - 1))  # a tool that reports accepted / proposed
        mine = lab.tau_from_drafts(mean_drafts)
        assert math.isclose(mine, tau, rel_tol=1e-9), (
            f"06_tau_conventions: your tau {mine:.3f} from {mean_drafts:.3f} drafts accepted per "
            "step is not the "
            f"steps' tau (step lengths {lengths}): what does a step commit besides its kept drafts?"
        )
        mine = lab.tau_from_rate(rate, block)
        assert math.isclose(mine, tau, rel_tol=1e-9), (
            f"06_tau_conventions: your tau {mine:.3f} from a rate of {rate:.3f} at block {block} "
            "is not the steps' "
            f"tau (step lengths {lengths}): how many drafts does a step propose?"
        )
