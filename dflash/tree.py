"""Draft trees: many continuations from one draft pass, checked by one verify pass.

A chain keeps each slot's likeliest token, so one wrong guess ends the step. A draft tree
(DDTree, Ringel & Romano 2026) grows the continuations likeliest under the drafter, best first,
up to N nodes; the target scores every node in one pass, each seeing the committed context and
its own path, and the longest path it agrees with is kept.

Node 0 is the root, the last committed token; nodes 1..N are drafts in the order chosen, so
parents come first. A node at depth d is at position start + d but in cache slot start + i (nodes
of one depth need their own slots); the kept path then moves to start, start + 1, ...
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch

from dflash.sampling import Sampling, as_sampling, sample


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

    `logprobs[d - 1][r]` is the log-probability of `candidates[d - 1][r]`, the r-th likeliest token
    at depth d, whatever the path (the drafter guesses every slot at once); a node scores the sum
    along its path. When the frontier's best node joins, its first child and next sibling enter the
    frontier: every other candidate scores no more than one of them, so nodes join best first.
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
    """mask[i][j]: node j is node i or an ancestor, so node i may see node j (siblings are other guesses
    for the same position). Parents come first, so a node's row is its parent's with itself added."""
    mask = []
    for node, parent in enumerate(parents):
        row = list(mask[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        mask.append(row)
    return mask


def verify_inputs(tree: DraftTree, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree as fixed-shape tensors for budget N: tokens (N+1,), depths (N+1,) and mask (N+1, N+1).

    Padded to N for one compiled shape per budget: a padding node is a parentless copy of the root
    that no node sees or descends from, so the walk never reaches it.
    """
    padding = budget - tree.size
    tokens = tree.tokens + [tree.tokens[0]] * padding
    depths = tree.depths + [0] * padding
    mask = ancestor_mask(tree.parents + [-1] * padding)
    return torch.tensor(tokens), torch.tensor(depths), torch.tensor(mask)


# ------------------------------------------------------- the walk, and the kept path


def walk(tree: DraftTree, target_tokens: list[int]) -> list[int]:
    """The accepted path, root first: node indices, node k at depth k.

    `target_tokens[i]` is the target's token after node i's path (argmax, or one draw per node). From
    the root the walk moves to the child holding the target's token while there is one; the step
    commits the target's token at every node of the path. Sampled, that is still exact: the tree was
    built before the draws, so each committed token follows p_target(. | context, path), as in the
    plain loop; drafting only decides how many of the draws one pass can use.
    """
    children = {(parent, token): node for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens))
                if node > 0}
    path = [0]
    while (path[-1], target_tokens[path[-1]]) in children:
        path.append(children[path[-1], target_tokens[path[-1]]])
    return path


def path_slots(path: list[int], start: int) -> list[int]:
    """The cache slots where the verify pass wrote the accepted path's keys and values: start + node index.
    They move to start, start + 1, ...: node k of the path has index >= k, so every slot moves down or stays."""
    return [start + node for node in path]


# ----------------------------------------------------------- the runner's tree steps


class TreeSteps:
    """The `ModelRunner`'s steps for a tree (generate.py mixes them in): the drafter's candidates, one
    verify pass over every node, and the accepted path moved into place. The buffers keep what a pass
    returns past the next pass, as the runner's own do."""

    def make_tree_buffers(self, budget: int, top_k: int, block: int, width: int, like: torch.Tensor) -> None:
        nodes = budget + 1
        self.node_offsets = torch.arange(nodes, device=like.device)  # a tree's cache slots, from 0
        self.node_tokens = torch.zeros(nodes, dtype=torch.long, device=like.device)  # the target's token after each
        self.node_features = like.new_zeros(1, nodes, width)  # and its features there
        self.draft_logprobs = torch.zeros(block - 1, top_k, device=like.device)  # the candidates per slot
        self.draft_candidates = torch.zeros(block - 1, top_k, dtype=torch.long, device=like.device)

    def draft_tree(self, context_features: torch.Tensor, last_token: int, start: int, after_prefill: bool):
        """As `draft`, the `tree_top_k` likeliest tokens at each slot, likeliest first: (block - 1, k)
        log-probabilities and ids; slot d's are the candidates at depth d of the tree."""
        with self.timed("draft"):
            logprobs, ids = self.run_drafter(context_features, last_token, start, after_prefill,
                                             tree_top_k=self.tree_top_k)
            return self.draft_logprobs.copy_(logprobs), self.draft_candidates.copy_(ids)

    def verify_tree(self, tree: DraftTree, sampling: Sampling | float, generator: torch.Generator | None):
        """The target's token after each node of `tree` (budget + 1,), padding nodes included. Node i goes
        to cache slot start + i at position start + depth(i) and sees the committed tokens, its ancestors
        and itself (`verify_inputs`); `keep_path` then commits the chosen path."""
        sampling = as_sampling(sampling)
        with self.timed("verify"):
            tokens, depths, tree_mask = (t.to(self.node_offsets.device) for t in verify_inputs(tree, self.tree_budget))
            start = self.target_cache.length
            picks, features = self.passes["verify"](self.target, self.target_cache, self.layer_ids, tokens[None],
                                                    depths + start, sampling.greedy, self.node_offsets + start,
                                                    tree_mask)
            self.node_features.copy_(features)
            return self.node_tokens.copy_(picks if sampling.greedy else sample(picks, sampling, generator))

    def keep_path(self, path: list[int]) -> torch.Tensor:
        """Commit the accepted `path` (node indices, root first): its keys and values move next to the
        committed ones, its features to the front of `features` (1, block, F) for the next draft."""
        start, nodes = self.target_cache.length, self.node_offsets.new_tensor(path)
        self.target_cache.compact(self.node_offsets.new_tensor(path_slots(path, start)), start)
        self.target_cache.extend(len(path))
        self.features[:, :len(path)] = self.node_features[:, nodes]  # (1, path, F)
        return self.features
