"""Notebook 7, exercise 3: drafts a tree keeps per step if the drafter's probabilities are right.

A node is kept when its whole path is the truth; if the drafter's per-slot probabilities were the truth's, that
happens with probability exp(score), so a tree keeps sum(exp(score)) drafts per step on average, root not counted.
Run from tutorials/: python solutions/07_expected_kept.py
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/, generate.py

import torch

from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from dflash.tree import build_tree
from generate import ModelRunner, generate_autoregressive, generate_dflash, generate_dflash_tree


def expected_kept(tree):
    """sum of exp(score) over the drafted nodes: the expected number of kept drafts under the drafter's own law."""
    return sum(math.exp(score) for score in tree.scores[1:])


WEIGHTS = Path.cwd().parent / "weights"
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
STOP = tokenizer.stop_token_ids
B, BUDGETS = drafter.config.block_size, [4, 8, 16, 32]
prompts = [encode_for_generation(p, tokenizer) for p in read_prompts(WEIGHTS / "heldout_problems.jsonl")[:6]]

expected = {n: [] for n in BUDGETS}
expected["chain"] = []
for ids, choices in prompts:
    truth = generate_autoregressive(target, ids, 32, first_token_choices=choices).new_ids
    for offset in range(0, 24, 4):  # draft steps along the greedy answer
        context = ids + truth[:offset]
        runner = ModelRunner(target, drafter, max_length=len(context) + 33 + B, block_size=B, tree_budget=32)
        last, features = runner.prefill(torch.tensor([context]), 0.0, None, choices if offset == 0 else None)
        logprobs, candidates = runner.draft_tree(features, last, len(context))  # (B - 1, 32) each
        for n in BUDGETS:
            best_first = build_tree(last, logprobs.tolist(), candidates.tolist(), n)
            chain_n = build_tree(last, logprobs[:n, :1].tolist(), candidates[:n, :1].tolist(), n)  # <= B - 1 nodes
            assert expected_kept(best_first) >= expected_kept(chain_n) - 1e-9, f"below the chain at N = {n}"
            expected[n].append(expected_kept(best_first))
        expected["chain"].append(expected_kept(build_tree(last, logprobs[:, :1].tolist(), candidates[:, :1].tolist(),
                                                          B - 1)))

measured = {"chain": [generate_dflash(target, drafter, ids, 64, stop_ids=STOP, first_token_choices=c)
                      for ids, c in prompts]}
for n in BUDGETS:
    measured[n] = [generate_dflash_tree(target, drafter, ids, 64, budget=n, stop_ids=STOP, first_token_choices=c)
                   for ids, c in prompts]
print(f"{'loop':>10} {'expected kept drafts':>21} {'measured tau - 1':>17}")
for name in ["chain"] + BUDGETS:
    lengths = [k for r in measured[name] for k in r.acceptance_lengths]
    mean_expected = sum(expected[name]) / len(expected[name])
    print(f"{str(name):>10} {mean_expected:>21.2f} {sum(lengths) / len(lengths) - 1:>17.2f}")
assert all(a <= b + 1e-9 for a, b in zip([sum(expected[n]) for n in BUDGETS], [sum(expected[n]) for n in BUDGETS[1:]]))
print("the best-first tree never expects fewer kept drafts than the chain of as many nodes; more nodes, more expected")
