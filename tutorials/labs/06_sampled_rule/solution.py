"""Lab 06_sampled_rule, the reference answer (notebook 6, section 7): the sampled-draft rule's two
parts.

kept[x] = q(x) min(1, p(x)/q(x)) = min(p(x), q(x)). A draft is rejected with probability
1 - sum min(p, q) = sum max(0, p - q), and then x is drawn from the residual, so
replaced[x] = max(0, p(x) - q(x)). Their sum, min(p, q) + max(0, p - q), is p(x): the rule commits
exactly the target's law, whatever the drafter's.
"""

import torch


def committed_parts(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P(commit x as the kept draft), P(commit x as the replacement): exactly."""
    # (vocab,): q(x) min(1, p(x)/q(x))
    kept = torch.where(q > 0, q * torch.clamp(p / q, max=1.0), 0.0)
    excess = (p - q).clamp(min=0.0)  # (vocab,)
    rejected = 1 - kept.sum()  # = excess.sum()
    residual = excess / excess.sum() if excess.sum() > 0 else torch.zeros_like(p)
    return kept, rejected * residual


def keep_probabilities(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(greedy rule: p(argmax q), sampled rule: sum min(p, q))."""
    return p[q.argmax()].item(), torch.minimum(p, q).sum().item()
