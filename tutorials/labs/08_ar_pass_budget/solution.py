"""Lab 08_ar_pass_budget, the reference answer (notebook 8, section 6): an autoregressive drafter's pass budget.

Equal speed gives pass_ms = (tau / dflash_speed - t_verify[block] - rest) / (block - 1), and no budget
when that is negative: even free passes fall short.
"""


def ar_pass_budget(alpha: float, block: int, costs) -> float | None:
    """The most a pass may cost (ms) for block - 1 of them to draft as fast per token as DFlash at 16."""
    room = costs.tau(alpha, block) / costs.dflash_speed - costs.t_verify[block] - costs.rest  # ms left for the passes
    return room / (block - 1) if room >= 0 else None
