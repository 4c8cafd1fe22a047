"""Lab 07_best_first_tree (notebook 7, section 2): the best-first tree builder, with a heap.

Write the function below, then grade it: python -m pytest tutorials/labs -k best_first_tree
"""

import heapq  # noqa: F401


def my_build_tree(root: int, logprobs: list[list[float]], candidates: list[list[int]],
                  budget: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the best-first draft tree of `budget` drafted nodes, root first.

    `candidates[d - 1][r]` is the r-th likeliest token at depth d and `logprobs[d - 1][r]` its log-probability,
    whatever the path; a node's score is the sum along its path. Keep a heap of candidate nodes keyed by score,
    starting with the root's first child; when a node joins the tree, push its next sibling (same parent, next
    rank) and its first child (rank 0, one deeper). Ties: the candidate pushed first joins first. Node 0 is
    `root` with parent -1; nodes join in the order they leave the heap. The grader compares with
    dflash.tree.build_tree over nine of the demo pair's draft steps, then runs the tree loop with your builder.
    """
    raise NotImplementedError
