"""Lab 08_speedup_by_hand, the reference answer (notebook 8, section 3): the passes-only model's speedup.

A step commits tau = 1 + alpha + ... + alpha^(B-1) tokens (the target's own token, then each draft kept
with probability alpha once the ones before it were) and costs one draft pass and one verify pass; the
plain loop commits one token per decode pass. In units of a decode pass, the speedup is
tau / (draft_cost + verify_cost).
"""


def tau_constant(alpha: float, block: int) -> float:
    """Expected tokens per step for a constant per-slot acceptance: a geometric sum."""
    return float(block) if alpha == 1 else (1 - alpha ** block) / (1 - alpha)


def speedup(alpha: float, block: int, draft_cost: float, verify_cost: float) -> float:
    """Tokens per step over the step's cost, both against the plain loop's one token per decode pass."""
    return tau_constant(alpha, block) / (draft_cost + verify_cost)
