"""Lab 08_ar_pass_budget (notebook 8, section 6): how cheap would an autoregressive drafter's
passes have to be to match DFlash?

Write the function below, then grade it: python -m pytest tutorials/labs -k ar_pass_budget
"""


def ar_pass_budget(alpha: float, block: int, costs) -> float | None:
    """The largest `pass_ms` at which an autoregressive drafter with constant acceptance alpha commits as many
    tokens per millisecond at `block` as DFlash does at block 16, or None when even free passes are not enough.

    Its step drafts block - 1 tokens, one pass each, and costs costs.t_verify[block] + costs.rest +
    (block - 1) * pass_ms milliseconds; it commits costs.tau(alpha, block) tokens on average. DFlash commits
    costs.dflash_speed tokens per millisecond of steps (notebook 8's measured figures).
    """
    raise NotImplementedError
