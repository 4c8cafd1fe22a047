"""Lab 06_tau_conventions, the reference answer (notebook 6, section 4): converting other tools' numbers to tau."""


def tau_from_drafts(mean_drafts: float) -> float:
    """Our tau, from a tool's mean of accepted drafts per step (bonus excluded): add the bonus token back."""
    return mean_drafts + 1


def tau_from_rate(rate: float, block_size: int) -> float:
    """Our tau, from drafts accepted / drafts proposed: each step proposes block_size - 1 drafts, plus the bonus."""
    return rate * (block_size - 1) + 1
