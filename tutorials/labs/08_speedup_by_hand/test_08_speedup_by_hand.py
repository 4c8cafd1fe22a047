"""Grades lab 08_speedup_by_hand against a simulation of the steps the model describes: every draft slot kept
with probability alpha until the first miss, the target's token after it, one draft and one verify pass a
step. Tokens over cost, in decode passes, over many simulated steps, must match the student's speedup."""

import torch

from _lab_helpers import drawn_generator

STEPS = 200_000


def drawn_cases(generator: torch.Generator) -> list[tuple[float, int, float, float]]:
    """(alpha, block, draft_cost, verify_cost): the edges (alpha 0 and 1), then cases drawn at run
    time."""
    def uniform(low, high):
        return round(low + (high - low) * torch.rand(1, generator=generator).item(), 3)
    cases = [(1.0, 16, 0.2, 1.3), (0.0, 4, 0.1, 1.0)]
    for _ in range(5):
        block = int(torch.randint(2, 17, (1,), generator=generator))
        cases.append((uniform(0.3, 0.97), block, uniform(0.02, 0.4), uniform(1.0, 2.5)))
    return cases


def simulated_speedup(alpha: float, block: int, draft_cost: float, verify_cost: float, generator) -> tuple:
    """(tokens per decode pass over STEPS simulated steps, its standard error)."""
    kept = (torch.rand(STEPS, block - 1, generator=generator, dtype=torch.float64) < alpha).long()  # (STEPS, block - 1)
    tokens = 1 + kept.cumprod(dim=1).sum(dim=1).double()  # (STEPS,): the drafts up to the first miss, then the target's
    cost = draft_cost + verify_cost
    return tokens.mean().item() / cost, tokens.std().item() / STEPS ** 0.5 / cost


def test_speedup_by_hand(lab):
    generator = drawn_generator()
    for alpha, block, draft_cost, verify_cost in drawn_cases(generator):
        mine = lab.speedup(alpha, block, draft_cost, verify_cost)
        simulated, error = simulated_speedup(alpha, block, draft_cost, verify_cost, generator)
        assert abs(mine - simulated) < 5 * error + 1e-9, (
            f"08_speedup_by_hand: speedup({alpha}, {block}, {draft_cost}, {verify_cost}) = "
            f"{mine:.4f}, more than "
            f"five standard errors {'above' if mine > simulated else 'below'} what simulating "
            "those steps gives"
        )
