"""Lab 09_capstone: the heart of DFlash, written by you: the speculative loop, from the runner's passes.

Write the function below, then grade it: python -m pytest tutorials/labs -k capstone
"""

import torch  # noqa: F401

from dflash.qwen3 import argmax  # noqa: F401: the greedy token, the first on a tie
from dflash.sampling import Sampling  # noqa: F401: Sampling() is greedy


def my_generate_dflash(runner, prompt_ids: list[int], max_new_tokens: int,
                       stop_ids=()) -> tuple[list[int], list[int]]:
    """Greedy DFlash decoding with `runner`, a generate.ModelRunner built for a target and its drafter:
    (new_ids, acceptance_lengths). new_ids are the tokens after the prompt, at most `max_new_tokens`,
    ending at the first stop token if one comes; acceptance_lengths holds, per step, how many tokens
    that step committed (counted whole, even past the limit). The output must be the plain greedy
    loop's, token for token, whatever the drafter guesses.

    The runner's methods (generate.py; docs/glossary.md names what they take and return):
    - runner.prefill(prompt_ids, Sampling(), None) -> (the first new token, the prompt's features)
    - runner.draft(features, last) -> the drafter's logits after `last`, (block_size - 1, vocab)
    - runner.verify(drafts) -> (the token the target picks after each slot of [last, drafts],
      (block_size,); the target's features there, (1, block_size, F))
    - runner.commit(kept) -> commits the first `kept` positions of the block just verified to the
      caches; returns their features, the next draft's
    - runner.block_size
    A step's tokens reach the host once: bring both tensors over in one call, not token by token.
    """
    raise NotImplementedError
