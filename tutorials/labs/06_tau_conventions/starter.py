"""Lab 06_tau_conventions (notebook 6, section 4; a warm-up): other tools' acceptance numbers
as our tau.

Write the two functions below, then grade them: python -m pytest tutorials/labs -k tau_conventions
"""


def tau_from_drafts(mean_drafts: float) -> float:
    """Our tau (tokens committed per step, bonus included) from a tool's mean of accepted drafts per step,
    which leaves the bonus token out."""
    raise NotImplementedError


def tau_from_rate(rate: float, block_size: int) -> float:
    """Our tau from an acceptance rate: drafts accepted / drafts proposed, block_size - 1 proposed per step."""
    raise NotImplementedError
