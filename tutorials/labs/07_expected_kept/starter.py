"""Lab 07_expected_kept (notebook 7, section 7): the drafts a tree keeps per step, on average,
if the drafter's probabilities are right.

Write the function below, then grade it: python -m pytest tutorials/labs -k expected_kept
"""

import math  # noqa: F401


def expected_kept(tree) -> float:
    """The expected number of drafts (the root not counted) a step keeps from `tree` (a dflash.tree.DraftTree:
    tokens, parents, depths, scores, root first), if the truth at every depth were drawn from the drafter's own
    distribution for that slot. A node is kept when its whole path is the truth; `tree.scores[i]` is the
    log-probability of node i's path under the drafter.
    """
    raise NotImplementedError
