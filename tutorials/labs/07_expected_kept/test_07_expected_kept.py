"""Grades lab 07_expected_kept against a simulation: the truth at every depth is drawn from the drafter's own
distribution for that slot (its candidates, and "anything else" for the rest of the mass), and the step keeps
the nodes whose whole path is the truth (what dflash.tree.walk follows). The mean over many draws must match,
for the demo pair's trees and made-up ones at budgets 4 to 32; and best first must never expect less than the
chain of as many nodes."""

import torch

from _lab_helpers import draft_steps, drawn_generator, random_step
from dflash.tree import build_tree

DRAWS, BUDGETS = 100_000, (4, 8, 16, 32)


def simulated_kept(tree, logprobs, candidates, generator) -> tuple[float, float]:
    """(mean kept drafts, its standard error) over DRAWS truths drawn slot by slot from the drafter's law."""
    probs = torch.tensor(logprobs, dtype=torch.float64).exp()  # (depth, k)
    rest = (1 - probs.sum(-1, keepdim=True)).clamp(min=0)  # (depth, 1): tokens outside the candidates
    law = torch.cat([probs, rest], -1)  # (depth, k + 1)
    draws = torch.multinomial(law, DRAWS, replacement=True, generator=generator)  # (depth, DRAWS): indices into law
    ids = torch.cat([torch.tensor(candidates), torch.full((len(candidates), 1), -1)], -1)  # (depth, k + 1)
    truth = ids.gather(1, draws)  # (depth, DRAWS): the true token at each depth, per draw
    on_path = [torch.ones(DRAWS, dtype=torch.bool)]  # per node: its whole path is the truth; the root always is
    for node in range(1, len(tree.tokens)):
        on_path.append(on_path[tree.parents[node]] & (truth[tree.depths[node] - 1] == tree.tokens[node]))
    kept = torch.stack(on_path[1:]).sum(0).double() if len(on_path) > 1 else torch.zeros(DRAWS, dtype=torch.float64)
    return kept.mean().item(), kept.std().item() / DRAWS ** 0.5


def test_expected_kept(lab, demo):
    generator = drawn_generator()
    steps = [random_step(generator, depth=15, width=32)]
    lab.expected_kept(build_tree(*steps[0], 4))  # a made-up step first: a starter fails before the model loads
    steps += draft_steps(demo, prompts=2, offsets=(0, 12))
    for root, logprobs, candidates in steps:
        for budget in BUDGETS:
            best_first = build_tree(root, logprobs, candidates, budget)
            mine = lab.expected_kept(best_first)
            simulated, error = simulated_kept(best_first, logprobs, candidates, generator)
            assert abs(mine - simulated) < 5 * error + 1e-6, (
                f"07_expected_kept: {mine:.4f} expected kept drafts for a tree of {budget} is more "
                "than five "
                f"standard errors {'above' if mine > simulated else 'below'} what drawing the "
                "truth from the "
                f"drafter's law keeps"
            )
            chain = build_tree(root, [row[:1] for row in logprobs[:budget]], [row[:1] for row in candidates[:budget]],
                               budget)  # one line of (at most) as many nodes
            assert mine >= lab.expected_kept(chain) - 1e-9, f"07_expected_kept: below the chain at budget {budget}"
