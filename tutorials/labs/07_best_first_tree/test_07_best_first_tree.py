"""Grades lab 07_best_first_tree against dflash.tree.build_tree (switched off while the student's builder runs):
on made-up steps first, then on nine of the demo pair's draft steps (three prompts, three places in each
answer) at every budget from 1 to 32, node for node: what the tree loop would verify is the
project's tree."""

import torch

import dflash.tree
import generate
from _lab_helpers import draft_steps, drawn_generator, forbidden, random_step
from dflash.tree import build_tree

RULE = "07_best_first_tree: the lab asks you to build the tree yourself"
BUDGETS = range(1, 33)


def tied_step(generator: torch.Generator, depth: int, width: int) -> tuple:
    """A made-up step whose log-probabilities are whole numbers: many paths tie, and the tie rule
    decides."""
    # (depth, width)
    logprobs = (
        -torch.randint(1, 4, (depth, width), generator=generator).sort(dim=1).values.float()
    )
    candidates = torch.stack(
        [torch.randperm(1000, generator=generator)[:width] for _ in range(depth)]
    )
    return (
        int(torch.randint(1000, (1,), generator=generator)),
        logprobs.tolist(),
        candidates.tolist(),
    )


def assert_same_trees(lab, steps, where: str) -> None:
    for index, (root, logprobs, candidates) in enumerate(steps):
        for budget in BUDGETS:
            reference = build_tree(root, logprobs, candidates, budget)
            with forbidden(lab, RULE, {dflash.tree: ["build_tree"], generate: ["build_tree"]}):
                tokens, parents = lab.my_build_tree(root, logprobs, candidates, budget)
            tokens, parents = list(tokens), list(parents)
            assert len(tokens) == len(parents) == len(reference.tokens), (
                f"07_best_first_tree: {where} {index}, budget {budget}: {len(tokens) - 1} drafted "
                "nodes, and "
                f"{len(parents) - 1} parents (how many nodes may the tree hold?)"
            )
            node = next(
                (
                    i
                    for i in range(len(tokens))
                    if (tokens[i], parents[i]) != (reference.tokens[i], reference.parents[i])
                ),
                None,
            )
            assert node is None, (
                f"07_best_first_tree: {where} {index}, budget {budget}: node {node} (token "
                f"{tokens[node]}, parent "
                f"{parents[node]}) is not the best-first tree's node {node}: what does a node "
                "score, and "
                f"which of two equal scores joins first?"
            )


def drawn_offsets(generator: torch.Generator) -> tuple[int, int]:
    """Two places in each answer to draft from, drawn at run time."""
    return tuple(sorted(torch.randint(1, 24, (2,), generator=generator).tolist()))


def test_best_first_tree(lab, demo):
    generator = drawn_generator()
    steps = [random_step(generator, depth=15, width=width) for width in (1, 3, 32)]
    tied = [tied_step(generator, 6, width) for width in (2, 3, 4)]
    assert_same_trees(lab, steps + tied, "made-up step")
    offsets = (0, *drawn_offsets(generator))
    assert_same_trees(lab, draft_steps(demo, prompts=3, offsets=offsets), "demo draft step")
