"""Grades lab 08_speedup_by_hand against a simulation of the steps the model describes: every draft slot kept
with probability alpha until the first miss, the target's token after it, one draft and one verify pass a
step. Tokens over cost, in decode passes, over many simulated steps, must match the student's speedup."""

import torch

STEPS = 200_000
CASES = [(0.8, 8, 0.1, 1.05), (0.7, 8, 0.1, 1.2), (0.7, 4, 0.1, 1.05), (1.0, 16, 0.2, 1.3), (0.0, 4, 0.1, 1.0),
         (0.95, 2, 0.05, 1.0), (0.5, 16, 0.3, 2.0)]


def simulated_speedup(alpha: float, block: int, draft_cost: float, verify_cost: float, generator) -> tuple:
    """(tokens per decode pass over STEPS simulated steps, its standard error)."""
    kept = (torch.rand(STEPS, block - 1, generator=generator, dtype=torch.float64) < alpha).long()  # (STEPS, block - 1)
    tokens = 1 + kept.cumprod(dim=1).sum(dim=1).double()  # (STEPS,): the drafts up to the first miss, then the target's
    cost = draft_cost + verify_cost
    return tokens.mean().item() / cost, tokens.std().item() / STEPS ** 0.5 / cost


def test_speedup_by_hand(lab):
    generator = torch.Generator().manual_seed(0)
    for alpha, block, draft_cost, verify_cost in CASES:
        mine = lab.speedup(alpha, block, draft_cost, verify_cost)
        simulated, error = simulated_speedup(alpha, block, draft_cost, verify_cost, generator)
        assert abs(mine - simulated) < 5 * error + 1e-9, (
            f"08_speedup_by_hand: speedup({alpha}, {block}, {draft_cost}, {verify_cost}) = {mine:.4f}; simulating "
            f"those steps gives {simulated:.4f} +- {error:.4f}")
