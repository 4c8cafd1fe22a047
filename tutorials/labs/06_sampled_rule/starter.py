"""Lab 06_sampled_rule (notebook 6, section 7; about 20 minutes): the sampled-draft rule commits exactly the
target's law; when it keeps more drafts than greedy drafts do.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k sampled_rule
"""

import torch  # noqa: F401


def committed_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exact probability (vocab,) that the sampled rule commits each token at one slot; p (target) and
    q (drafter), (vocab,) each. The rule: draw d ~ q; keep it with probability min(1, p(d) / q(d)); else
    commit a draw from the residual max(0, p - q), normalised. Compute the law, do not sample it.
    """
    raise NotImplementedError


def keep_probabilities(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(greedy, sampled): the probability that one slot keeps its draft under each rule.

    Greedy: the draft is argmax q, kept when the target's own draw from p equals it.
    Sampled: the rule above. Try p = (0.9, 0.05, 0.05), q = (0.5, 0.3, 0.2), and p = q = (0.4, 0.3, 0.3):
    which rule keeps more in each?
    """
    raise NotImplementedError
