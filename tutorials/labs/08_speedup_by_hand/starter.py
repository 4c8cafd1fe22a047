"""Lab 08_speedup_by_hand (notebook 8, section 3): the speedup the passes-only cost model predicts.

Write the function below, then grade it: python -m pytest tutorials/labs -k speedup_by_hand
"""


def speedup(alpha: float, block: int, draft_cost: float, verify_cost: float) -> float:
    """The speedup over the plain loop (one token per decode pass) of DFlash steps that each draft block - 1
    tokens, keep each draft with probability alpha once every draft before it was kept, and always commit the
    target's own token after the kept ones; a step costs one draft pass (`draft_cost` decode passes) and one
    verify pass (`verify_cost` decode passes). No prefill, no other cost.

    Then decide (notebook 8): alpha 0.7, a draft pass of 0.1; verifying 8 tokens costs 1.2 decode passes,
    4 tokens 1.05. Is block 8 or block 4 faster?
    """
    raise NotImplementedError
