"""Grades lab 08_ar_pass_budget by what a budget means: at that pass time the autoregressive drafter's speed
equals DFlash's, and None only where free passes already fall short. Made-up costs shaped like notebook 8's
CPU figures, fast and slow DFlash, so that both answers occur."""

import types

from _lab_helpers import drawn_random


def tau(alpha: float, block: int) -> float:
    """Expected tokens per step: slot k of block - 1 drafts is reached with probability alpha^k."""
    return sum(alpha ** k for k in range(block))


def test_ar_pass_budget(lab):
    rng, answers = drawn_random(), set()
    cases = [(1.0, 16), (0.5, 2)] + [
        (round(rng.uniform(0.4, 0.99), 3), rng.randrange(2, 17)) for _ in range(10)
    ]
    # tokens per ms
    for dflash_speed in (rng.uniform(0.2, 0.4), rng.uniform(0.5, 0.8), rng.uniform(1.0, 1.5)):
        # a verify's cost: base + slope * block, in ms
        base, slope = rng.uniform(3.0, 5.0), rng.uniform(0.1, 0.4)
        costs = types.SimpleNamespace(
            t_verify={b: base + slope * b for b in range(2, 17)},
            rest=rng.uniform(0.3, 1.0),
            dflash_speed=dflash_speed,
            tau=tau,
        )

        def ar_speed(alpha, block, pass_ms):
            return tau(alpha, block) / (costs.t_verify[block] + costs.rest + (block - 1) * pass_ms)

        for alpha, block in cases:
            budget = lab.ar_pass_budget(alpha, block, costs)
            answers.add(budget is None)
            if budget is None:
                assert ar_speed(alpha, block, 0.0) < dflash_speed, (
                    f"08_ar_pass_budget: alpha {alpha}, block {block}: None, but free passes give "
                    f"{ar_speed(alpha, block, 0.0):.3f} tokens/ms against DFlash's "
                    f"{dflash_speed:.3f}")
            else:
                assert budget >= 0 and abs(ar_speed(alpha, block, budget) / dflash_speed - 1) < 1e-9, (
                    f"08_ar_pass_budget: alpha {alpha}, block {block}: at {budget} ms a pass the drafter makes "
                    f"{ar_speed(alpha, block, budget):.4f} tokens/ms, not DFlash's "
                    f"{dflash_speed:.3f}")
    assert answers == {True, False}, "08_ar_pass_budget: the made-up costs should produce both kinds of answer"
