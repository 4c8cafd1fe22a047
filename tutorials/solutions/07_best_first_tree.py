"""Notebook 7, exercise 1: the best-first tree builder with a heap, checked against dflash.tree.build_tree.

Run from tutorials/: python solutions/07_best_first_tree.py
"""

import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/, generate.py

import torch

from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from dflash.tree import build_tree
from generate import ModelRunner, generate_autoregressive


def my_build_tree(root, logprobs, candidates, budget):
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


WEIGHTS = Path.cwd().parent / "weights"
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
B, K = drafter.config.block_size, 32
checked = 0
for prompt in read_prompts(WEIGHTS / "heldout_problems.jsonl")[:3]:
    ids, choices = encode_for_generation(prompt, tokenizer)
    truth = generate_autoregressive(target, ids, 24, first_token_choices=choices).new_ids
    for offset in (0, 8, 16):  # a few steps: after the prompt, and inside the answer
        context = ids + truth[:offset]
        runner = ModelRunner(target, drafter, max_length=len(context) + K + 1 + B, block_size=B, tree_budget=K)
        last, features = runner.prefill(torch.tensor([context]), 0.0, None, choices if offset == 0 else None)
        logprobs, candidates = (t.tolist() for t in runner.draft_tree(features, last, len(context)))
        for budget in range(1, K + 1):
            reference = build_tree(last, logprobs, candidates, budget)
            assert my_build_tree(last, logprobs, candidates, budget) == (reference.tokens, reference.parents), \
                f"differs from build_tree at budget {budget}"
            checked += 1
print(f"my_build_tree == build_tree on {checked} trees (9 draft steps, budgets 1 to {K})")
