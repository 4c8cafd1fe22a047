"""Draft trees: many continuations from one draft pass, checked by one verify pass.

The DFlash drafter gives a whole distribution for every slot of its block, and the
chain keeps only each slot's likeliest token: one wrong guess ends the step. A draft
tree (DDTree, Ringel & Romano 2026) keeps more of it. From the per-slot
distributions it grows the continuations most likely under the drafter, best first,
until a budget of N nodes is spent; the target scores every node in one pass, each
node seeing only the committed context, its ancestors and itself; and the longest
path on which the target agrees is kept. The chain is the tree whose every node has
one child.

The shapes, for a budget N and a step that starts at position `start`:

- node 0 is the root: the last committed token, not yet in the target's cache;
- nodes 1..N are drafted tokens, numbered in the order they were chosen, so a parent
  always comes before its children;
- a node at depth d is a guess for position start + d (its RoPE position), but is
  written to cache slot start + i, its own index: nodes of one depth need slots of
  their own. After the walk, the accepted path is moved to slots start, start + 1,
  ... (`path_slots`), so that the cache again holds one sequence.

Reading order: building the tree, the verify pass's inputs (tokens, depths, the
ancestor mask), the walk, and the compaction's bookkeeping. Everything here is plain
Python on small lists; the tensors are built at the end, for the model.
"""

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
    scores: list[float]  # log-probability of the path root -> node under the drafter; 0 for the root

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


def build_tree(root: int, logprobs: list[list[float]], candidates: list[list[int]], budget: int) -> DraftTree:
    """The `budget` likeliest continuations of `root` under the drafter, as a tree.

    `logprobs[d - 1][r]` is the drafter's log-probability of its r-th likeliest token
    `candidates[d - 1][r]` for depth d (the block's slot d), sorted from likeliest
    down. The drafter guesses every slot at once, so a node's children are drawn
    from its depth's candidates whatever its path; a node's score is the sum of the
    log-probabilities along its path.

    Best first: a heap holds the frontier, and the best-scoring node on it joins
    the tree next. When a node joins, two nodes enter the frontier: its first child
    (the likeliest token one level down) and its next sibling (the parent's
    next-likeliest child). Every other candidate scores no more than one of these, so
    the nodes join in order of score, and the tree holds the `budget` best
    continuations whose ancestors are all in it. Ties go to the earlier pushed.
    """
    tree = DraftTree.rooted_at(root)
    depth_limit, width = len(logprobs), len(logprobs[0])
    frontier: list[tuple[float, int, int, int, int]] = []  # (-score, order pushed, parent, depth, rank)
    order = itertools.count()

    def push(parent: int, depth: int, rank: int) -> None:
        score = tree.scores[parent] + logprobs[depth - 1][rank]
        heapq.heappush(frontier, (-score, next(order), parent, depth, rank))  # heapq pops the smallest

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
    """mask[i][j]: node j is node i or one of its ancestors, so node i's query may see node j's key.

    That is the tree's causal mask: a node is conditioned on its own path and nothing
    else (its siblings and cousins are other guesses for the same positions). Parents
    come before children, so a node's row is its parent's with itself added.
    """
    mask = []
    for node, parent in enumerate(parents):
        row = list(mask[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        mask.append(row)
    return mask


def verify_inputs(tree: DraftTree, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree as fixed-shape tensors for budget N: tokens (N+1,), depths (N+1,) and mask (N+1, N+1).

    A tree of fewer than N nodes (a peaked drafter, a short block) is padded to N,
    so that a compiled verify pass sees one shape per budget. A padding node is a copy
    of the root at depth 0 with no parent: it sees only itself (and the committed
    context), no node sees it, and no node is its child, so the walk never reaches it.
    """
    padding = budget - tree.size
    tokens = tree.tokens + [tree.tokens[0]] * padding
    depths = tree.depths + [0] * padding
    mask = ancestor_mask(tree.parents + [-1] * padding)
    return torch.tensor(tokens), torch.tensor(depths), torch.tensor(mask)


# ----------------------------------------------------------------------- the walk


def walk(tree: DraftTree, target_tokens: list[int]) -> list[int]:
    """The accepted path, root first: node indices, node k at depth k.

    `target_tokens[i]` is the token the target picks after node i's path (the
    argmax at temperature 0, else a sample from softmax(logits / T), one independent
    draw per node). From the root, the walk moves to the child whose token equals the
    target's token at the current node, as long as there is one (siblings hold
    different tokens, so there is at most one). The step then commits the target's
    token at every node of the path: the accepted drafts, which equal them, and the
    target's own token after the last node, the bonus.

    Greedy, that is exactly what the target alone would write, one token at a time.

    Sampling loses nothing either, by the chain's argument. Follow the walk: at the
    current node, whose path is what has been committed so far, the committed token
    is the target's draw there, taken from p_target(. | context, path). The tree
    was built from the drafter's outputs before any of this step's draws, and each
    node's draw is independent of the others', so neither the tree nor the way the
    walk got here biases it. Every committed token is thus distributed as the
    target's next token given everything before it, which is how the plain loop
    samples: the output follows the target's distribution exactly. Drafting only
    decides how many draws one pass can use: the walk goes on while the draw lands
    on a child. (Drawing at every node up front, as the pass does, and drawing only
    at the nodes the walk visits give the same law: unvisited draws are never read.)
    """
    children = {(parent, token): node for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens))
                if node > 0}
    path = [0]
    while (path[-1], target_tokens[path[-1]]) in children:
        path.append(children[path[-1], target_tokens[path[-1]]])
    return path


# -------------------------------------------------------------------- compaction


def path_slots(path: list[int], start: int) -> list[int]:
    """The cache slots where the verify pass wrote the accepted path's keys and values: start + node index.

    They move to start + depth = start, start + 1, ..., start + len(path) - 1, the
    slots the committed sequence expects. Node k of the path has index >= k (its k
    ancestors come before it), so every slot moves down or stays, never up; slot
    start (the root) always stays. A path of nodes 0, 1, 2, ... (what a chain
    always accepts) stays where it is.
    """
    return [start + node for node in path]
