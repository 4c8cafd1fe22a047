"""Lab 07_expected_kept, the reference answer (notebook 7, section 7): expected kept drafts per step.

A node is kept when its whole path is the truth; if the drafter's per-slot probabilities were the truth's, that
happens with probability exp(score), so by linearity of expectation a tree keeps sum(exp(score)) drafts per step.
"""

import math


def expected_kept(tree) -> float:
    """sum of exp(score) over the drafted nodes: the expected number of kept drafts under the drafter's own law."""
    return sum(math.exp(score) for score in tree.scores[1:])
