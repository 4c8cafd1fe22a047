"""Notebook 8, exercise 1: the speedup the passes-only cost model predicts, by hand.

A step commits tau = 1 + alpha + ... + alpha^(B-1) tokens (the target's own token, then each
draft kept with probability alpha once the ones before it were) and costs one draft pass and
one verify pass; the plain loop commits one token per decode pass. In units of a decode pass,
the speedup is tau / (draft_cost + verify_cost).

Run from tutorials/: python solutions/08_speedup_by_hand.py
"""


def tau_constant(alpha: float, block: int) -> float:
    """Expected tokens per step for a constant per-slot acceptance: a geometric sum."""
    return float(block) if alpha == 1 else (1 - alpha ** block) / (1 - alpha)


def speedup(alpha: float, block: int, draft_cost: float, verify_cost: float) -> float:
    """Tokens per step over the step's cost, both against the plain loop's one token per decode pass."""
    return tau_constant(alpha, block) / (draft_cost + verify_cost)


if __name__ == "__main__":
    assert abs(tau_constant(0.7, 8) - sum(0.7 ** k for k in range(8))) < 1e-12  # the closed form is the sum
    answer = speedup(0.8, 8, 0.1, 1.05)
    assert abs(answer - (1 - 0.8 ** 8) / 0.2 / 1.15) < 1e-9, "the notebook's check"
    b8, b4 = speedup(0.7, 8, 0.1, 1.2), speedup(0.7, 4, 0.1, 1.05)
    print(f"alpha 0.8, block 8, draft 0.1, verify 1.05: {answer:.3f}x")
    print(f"alpha 0.7: block 8 {b8:.2f}x (tau {tau_constant(0.7, 8):.2f}), block 4 {b4:.2f}x "
          f"(tau {tau_constant(0.7, 4):.2f}): block {8 if b8 > b4 else 4} is faster")
    # Slots 5..8 add 0.7^4 + ... + 0.7^7 = 0.61 tokens per step (+24 % over block 4's tau) for +13 % of step cost.
    assert b8 > b4
