"""Lab 07_best_first_tree, the reference answer (notebook 7, section 2): the best-first tree builder with a heap."""

import heapq


def my_build_tree(root: int, logprobs: list[list[float]], candidates: list[list[int]],
                  budget: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the best-first tree of `budget` nodes, root first.

    A candidate node is (its path's score, its parent, its depth, its rank among its depth's candidates).
    When a node joins, its next sibling (same parent, next rank) and its first child (rank 0, one deeper) become
    candidates: every other candidate scores no more than one of these, so the heap always holds the best one.
    """
    tokens, parents, scores = [root], [-1], [0.0]
    frontier, pushed = [], 0  # heapq pops the smallest: keep -score; `pushed` breaks ties, first pushed first

    def push(parent, depth, rank):
        nonlocal pushed
        heapq.heappush(frontier, (-(scores[parent] + logprobs[depth - 1][rank]), pushed, parent, depth, rank))
        pushed += 1

    push(0, 1, 0)
    while frontier and len(tokens) - 1 < budget:
        negative, _, parent, depth, rank = heapq.heappop(frontier)
        tokens.append(candidates[depth - 1][rank])
        parents.append(parent)
        scores.append(-negative)
        if rank + 1 < len(candidates[0]):
            push(parent, depth, rank + 1)
        if depth < len(candidates):
            push(len(tokens) - 1, depth + 1, 0)
    return tokens, parents
