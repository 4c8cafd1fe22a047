"""Lab 09_capstone_tree, the capstone's extension: DFlash with a draft tree, the walk and the commit
written by you.

Write the function below, then grade it: python -m pytest tutorials/labs -k capstone_tree
"""

import torch  # noqa: F401

from dflash.sampling import Sampling  # noqa: F401: Sampling() is greedy
from dflash.tree import build_tree  # noqa: F401: a tree from one draft pass (notebook 7)


def my_generate_dflash_tree(runner, prompt_ids: list[int], max_new_tokens: int, budget: int,
                            stop_ids=()) -> tuple[list[int], list[int]]:
    """Greedy DFlash decoding with a tree of `budget` drafted nodes per step, as the capstone's loop
    returns it: (new_ids, acceptance_lengths). `runner` is a generate.ModelRunner built with
    tree_budget=budget; the output must be the plain greedy loop's, token for token.

    The runner's methods (generate.py; notebook 7):
    - runner.prefill(prompt_ids, Sampling(), None) -> (the first new token, the prompt's features)
    - runner.draft_tree(features, last) -> ((block_size - 1, k) log-probabilities, (block_size - 1, k)
      token ids), each slot's candidates likeliest first
    - build_tree(last, logprobs, candidates, budget) -> a DraftTree (lists: `tokens`, `parents`;
      node 0 is the root, `last`)
    - runner.verify_tree(tree, Sampling(), None) -> the token the target picks after each node
      (budget + 1,)
    - runner.commit_path(path) -> commits the nodes of `path` (node indices, root first) to the
      target's cache, in order; returns their features, the next draft's
    Which nodes does a step keep, and which tokens does it commit? (dflash.tree's walk is the
    project's answer: the lab forbids it.)
    """
    raise NotImplementedError
