"""Grades lab 07_ancestor_mask against dflash.tree.ancestor_mask on 200 random trees (switched off while the
student's function runs), then inside the demo pair: the tree verify pass over real draft trees
masks with the student's function, and the target must still pick, after every node, the token
it picks with the project's mask."""

from unittest import mock

import torch

import dflash.tree
from _lab_helpers import assert_tree_verified_alike, drawn_random, forbidden
from dflash.tree import DraftTree, ancestor_mask

RULE = "07_ancestor_mask: the lab asks you to build the mask yourself"


def plugged_into_the_verify_pass(my_ancestor_mask, calls: list):
    """The student's list function where `verify_inputs` builds the mask: that seam takes the parents as a tensor
    on the verify pass's device (the project builds the mask there), so the student's function gets them as a
    list and its rows go back as a tensor. Each call is counted: a seam that moved would grade nothing."""
    def mask_of(parents: torch.Tensor) -> torch.Tensor:
        calls.append(parents.shape[0])
        return torch.tensor(my_ancestor_mask(parents.tolist()), dtype=torch.bool, device=parents.device)  # (n, n)
    return mock.patch.object(dflash.tree, "ancestor_mask_by_solve", mask_of)


def test_ancestor_mask(lab, demo):
    rng = drawn_random()
    for _ in range(200):  # random trees: parents come first, as build_tree adds them
        tree = DraftTree.rooted_at(0)
        for _ in range(rng.randrange(0, 40)):
            tree.add(rng.randrange(100), rng.randrange(len(tree.tokens)), 0.0)
        with forbidden(lab, RULE, {dflash.tree: ["ancestor_mask", "ancestor_mask_by_solve"]}):
            mine = lab.my_ancestor_mask(list(tree.parents))
        wrong = [
            i
            for i, (row, right) in enumerate(zip(mine, ancestor_mask(tree.parents)))
            if list(row) != right
        ]
        assert len(mine) == len(tree.parents) and not wrong, (
            f"07_ancestor_mask: for the tree with parents {tree.parents}, row "
            f"{wrong[0] if wrong else len(mine)} "
            f"is wrong (which nodes may node {wrong[0] if wrong else len(mine)} see?)"
        )
    calls = []
    assert_tree_verified_alike(demo, plugged_into_the_verify_pass(lab.my_ancestor_mask, calls),
                               "07_ancestor_mask: with your mask in the tree's verify pass")
    assert calls, "07_ancestor_mask: the grader's plug-in never reached a verify pass (the project's seam moved)"
