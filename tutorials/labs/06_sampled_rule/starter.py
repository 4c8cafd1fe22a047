"""Lab 06_sampled_rule (notebook 6, section 7): where the sampled-draft rule's committed tokens come
from, and when it keeps more drafts than greedy drafts do.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k sampled_rule
"""

import torch  # noqa: F401


def committed_parts(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, replaced), (vocab,) each: the exact probability that one slot commits token x *as its
    kept draft* (kept[x]), and as the target's replacement after the draft was rejected
    (replaced[x]).

    p (target) and q (drafter) are (vocab,) laws. The sampled rule: draw d ~ q; keep it with
    probability min(1, p(d) / q(d)); else commit a draw from the residual max(0, p - q), normalised.
    Compute the two parts exactly, do not sample them. Then show, on paper, what kept + replaced is,
    and why."""
    raise NotImplementedError


def keep_probabilities(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(greedy, sampled): the probability that one slot keeps its draft under each rule.

    Greedy: the draft is argmax q, kept when the target's own draw from p equals it. Sampled: the
    rule above. Try p = (0.9, 0.05, 0.05), q = (0.5, 0.3, 0.2), and p = q = (0.4, 0.3, 0.3): which
    rule keeps more in each?"""
    raise NotImplementedError
