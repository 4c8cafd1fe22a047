"""Lab 06_sampled_rule, the reference answer (notebook 6, section 7): the sampled-draft rule."""

import torch


def committed_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(commit x) = P(draw x from q and keep it) + P(reject) * residual(x), exactly."""
    kept = torch.where(q > 0, q * torch.clamp(p / q, max=1.0), 0.0)  # (vocab,): q(x) min(1, p(x)/q(x)) = min(p, q)
    excess = (p - q).clamp(min=0.0)  # (vocab,)
    rejected = 1 - kept.sum()  # = excess.sum()
    residual = excess / excess.sum() if excess.sum() > 0 else torch.zeros_like(p)
    return kept + rejected * residual


def keep_probabilities(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """(greedy rule: p(argmax q), sampled rule: sum min(p, q))."""
    return p[q.argmax()].item(), torch.minimum(p, q).sum().item()
