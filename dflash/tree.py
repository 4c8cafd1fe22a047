"""Draft trees: many continuations from one draft pass, checked by one verify pass.

A chain keeps each slot's likeliest token, so one wrong guess ends the step. A draft tree
(DDTree, Ringel & Romano 2026) grows the continuations likeliest under the drafter, best first,
up to N nodes; the target scores every node in one pass, each seeing the committed context and
its own path, and the longest path it agrees with is kept.

Node 0 is the root, the last committed token; nodes 1..N are drafts in the order chosen, so
parents come first. A node at depth d is at position start + d but in cache slot start + i (nodes
of one depth need their own slots); the kept path then moves to start, start + 1, ..."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """The nodes of a draft tree, root first; each list is indexed by node."""

    tokens: list[int]  # node i's token; the root's is the last committed token
    parents: list[int]  # node i's parent; -1 for the root
    depths: list[int]  # 0 for the root; a depth-d node guesses the token d after the root
    scores: list[float]  # log-probability of the path root -> node under the drafter; root: 0

    @classmethod
    def rooted_at(cls, token: int) -> "DraftTree":
        """A tree of the root alone: `token`, the last committed token."""
        return cls([token], [-1], [0], [0.0])

    def add(self, token: int, parent: int, score: float) -> int:
        """Append a child of `parent`; return its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    @property
    def size(self) -> int:
        """The drafted nodes, the root not counted."""
        return len(self.tokens) - 1


# ---------------------------------------------------------------- building the tree


def build_tree(root: int, logprobs: list[list[float]], candidates: list[list[int]],
               budget: int) -> DraftTree:
    """The `budget` likeliest continuations of `root` under the drafter, as a tree.
    `logprobs[d - 1][r]` is the log-probability of `candidates[d - 1][r]`, the r-th likeliest token
    at depth d, whatever the path (the drafter guesses every slot at once); a node scores the sum
    along its path. When the frontier's best node joins, its first child and next sibling enter the
    frontier: every other candidate scores no more than one of them, so nodes join best first."""
    tree = DraftTree.rooted_at(root)
    depth_limit, width = len(logprobs), len(logprobs[0])
    frontier: list[tuple[float, int, int, int, int]] = []  # (-score, order, parent, depth, rank)
    order = itertools.count()

    def push(parent: int, depth: int, rank: int) -> None:
        score = tree.scores[parent] + logprobs[depth - 1][rank]
        heapq.heappush(frontier, (-score, next(order), parent, depth, rank))  # pops the smallest

    push(0, 1, 0)
    while frontier and tree.size < budget:
        negative_score, _, parent, depth, rank = heapq.heappop(frontier)
        node = tree.add(candidates[depth - 1][rank], parent, -negative_score)
        if rank + 1 < width:
            push(parent, depth, rank + 1)  # the next sibling
        if depth < depth_limit:
            push(node, depth + 1, 0)  # the first child
    return tree


# ------------------------------------------------------------ the verify pass's inputs


def ancestor_mask(parents: list[int]) -> list[list[bool]]:
    """mask[i][j]: node j is node i or an ancestor, so node i may see node j (siblings are other
    guesses for the same position). Parents come first, so a node's row is its parent's plus itself.
    The readable definition: the verify pass builds it where it runs (`ancestor_mask_by_solve`)."""
    mask = []
    for node, parent in enumerate(parents):
        row = list(mask[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        mask.append(row)
    return mask


def ancestor_mask_by_solve(parents: torch.Tensor) -> torch.Tensor:
    """`ancestor_mask` where the verify pass runs, no host round trip: parents (n,), -1 for the root
    and padding -> mask (n, n). Its rule, a row is the parent's plus itself, reads M = I + A M
    (A[i, j] = 1: j is i's parent), so (I - A) M = I: parents first, one triangular solve. O(n^3)
    work in 7 ops: no slower than pointer doubling up to 64 nodes; doubling wins at hundreds."""
    nodes = torch.arange(parents.shape[0], device=parents.device)  # (n,)
    eye = torch.eye(parents.shape[0], dtype=torch.float32, device=parents.device)  # (n, n)
    parent_of = (parents[:, None] == nodes).float()  # (n, n): A; -1 (root, padding) matches no node
    paths = torch.linalg.solve_triangular(eye - parent_of, eye, upper=False, unitriangular=True)
    return paths > 0.5  # (n, n): M, path counts 0 or 1


def verify_inputs(tree: DraftTree, budget: int, device: torch.device | str | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree as fixed-shape tensors for budget N on `device`: tokens (N+1,), depths (N+1,) and
    mask (N+1, N+1). Padded to N for one compiled shape per budget: a padding node is a parentless
    copy of the root that no node sees or descends from, so the walk never reaches it. Only tokens,
    depths and parents cross to the device, in one copy; the mask, O(N^2), is built there."""
    padding = budget - tree.size
    rows = [tree.tokens + [tree.tokens[0]] * padding, tree.depths + [0] * padding,
            tree.parents + [-1] * padding]
    tokens, depths, parents = torch.tensor(rows).to(device)  # (3, N+1) -> (N+1,) each, in one copy
    return tokens, depths, ancestor_mask_by_solve(parents)


# ------------------------------------------------------- the walk, and the kept path


def walk(tree: DraftTree, target_tokens: list[int]) -> list[int]:
    """The accepted path, root first: node indices, node k at depth k.
    `target_tokens[i]` is the target's token after node i's path (argmax, or one draw per node).
    From the root the walk moves to the child holding the target's token while there is one; the
    step commits the target's token at every node of the path. Sampled, that is still exact: the
    tree was built before the draws, so each committed token follows p_target(. | context, path),
    as in the plain loop; drafting only decides how many of the draws one pass can use."""
    children = {(parent, token): node
                for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens)) if node > 0}
    path = [0]
    while (path[-1], target_tokens[path[-1]]) in children:
        path.append(children[path[-1], target_tokens[path[-1]]])
    return path


def path_slots(path: list[int], start: int) -> list[int]:
    """Where the verify pass wrote the accepted path's keys and values: start + node index. They
    move to start, start + 1, ...: path node k has index >= k, so each moves down or stays."""
    return [start + node for node in path]
