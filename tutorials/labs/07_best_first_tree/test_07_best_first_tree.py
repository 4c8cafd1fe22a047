"""Grades lab 07_best_first_tree against dflash.tree.build_tree (switched off while the student's builder runs):
on made-up steps first, then on nine of the demo pair's draft steps (three prompts, three places in each
answer) at every budget from 1 to 32; then the tree loop builds every tree with the student's function and must
still write the plain loop's tokens."""

from unittest import mock

import torch

import dflash.tree
import generate
from _lab_helpers import draft_steps, random_step, switched_off, tree_loop
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


def assert_same_trees(lab, steps, where: str) -> None:
    for index, (root, logprobs, candidates) in enumerate(steps):
        for budget in BUDGETS:
            reference = build_tree(root, logprobs, candidates, budget)
            with switched_off(RULE, {dflash.tree: ["build_tree"], generate: ["build_tree"]}):
                tokens, parents = lab.my_build_tree(root, logprobs, candidates, budget)
            assert (list(tokens), list(parents)) == (reference.tokens, reference.parents), (
                f"07_best_first_tree: {where} {index}, budget {budget}: tokens {list(tokens)}, parents "
                f"{list(parents)}; build_tree makes tokens {reference.tokens}, parents {reference.parents}")


def test_best_first_tree(lab, demo):
    generator = torch.Generator().manual_seed(0)
    assert_same_trees(lab, [random_step(generator, depth=15, width=width) for width in (1, 3, 32)], "made-up step")
    assert_same_trees(lab, draft_steps(demo, prompts=3, offsets=(0, 8, 16)), "demo draft step")
    plugged = mock.patch.object(generate, "build_tree", as_draft_tree(lab.my_build_tree))  # what the loop calls
    demo.assert_plugged_in_matches(plugged, tree_loop(demo), "07_best_first_tree: with your builder in the tree loop")
