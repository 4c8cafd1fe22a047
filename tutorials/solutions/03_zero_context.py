"""Notebook 3, exercise 1: the drafter without the target's features; the drafts and tau collapse.

Run from tutorials/: python solutions/03_zero_context.py
"""

import torch

from _demo_pair import block, drafter, heldout_prompts, target, tokenizer
from generate import ModelRunner, generate_dflash

torch.set_grad_enabled(False)  # inference only

prompts = heldout_prompts(8)


class BlindRunner(ModelRunner):
    """A runner whose drafter sees zeros where the target's features should be."""

    seen: list  # every draft's guesses, to look at

    def draft(self, context_features, *args, **kwargs):
        drafts = super().draft(torch.zeros_like(context_features), *args, **kwargs)  # (block - 1,)
        self.seen = getattr(self, "seen", []) + [drafts.tolist()]
        return drafts


def pooled_tau(runner_class):
    lengths, runners = [], []
    for ids in prompts:
        runners.append(runner_class(target, drafter, max_length=len(ids) + 96 + block))
        lengths += generate_dflash(target, drafter, ids, 96, stop_ids=tokenizer.stop_token_ids,
                                   runner=runners[-1]).acceptance_lengths
    return sum(lengths) / len(lengths), runners


def tau_without_context():
    return pooled_tau(BlindRunner)[0]


tau_real, _ = pooled_tau(ModelRunner)
tau_blind, blind_runners = pooled_tau(BlindRunner)
print(f"pooled tau with the target's features {tau_real:.2f}, without them {tau_blind:.2f}")
print("the blind drafter's first guesses:", [tokenizer.decode([t]) for t in blind_runners[0].seen[0]])
assert tau_blind < tau_real / 2, "without the target's features the drafts collapse"
print("checks passed")
