"""Grades lab 07_best_first_tree against dflash.tree.build_tree (switched off while the student's builder runs):
on made-up steps first, then on nine of the demo pair's draft steps (three prompts, three places in each
answer) at every budget from 1 to 32; then the tree loop builds every tree with the student's function and must
still write the plain loop's tokens."""

from unittest import mock

import torch

import dflash.tree
import generate
from _lab_helpers import draft_steps, drawn_generator, forbidden, random_step, tree_loop
from dflash.tree import DraftTree, build_tree

RULE = "07_best_first_tree: the lab asks you to build the tree yourself"
BUDGETS = range(1, 33)


def as_draft_tree(my_build_tree):
    """build_tree's stand-in for the tree loop: the student's (tokens, parents) as a DraftTree."""
    def build(root, logprobs, candidates, budget):
        tokens, parents = my_build_tree(root, logprobs, candidates, budget)
        tree = DraftTree.rooted_at(tokens[0])
        for token, parent in zip(tokens[1:], parents[1:]):
            tree.add(token, parent, 0.0)  # the loop reads tokens, parents and depths, not scores
        return tree
    return build


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
    plugged = mock.patch.object(generate, "build_tree", as_draft_tree(lab.my_build_tree))  # what the loop calls
    demo.assert_plugged_in_matches(plugged, tree_loop(demo), "07_best_first_tree: with your builder in the tree loop")
