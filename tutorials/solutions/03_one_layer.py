"""Notebook 3, exercise 3: the drafter with one of its two target layers' features zeroed.

Run from tutorials/: python solutions/03_one_layer.py
"""

import torch

from _demo_pair import block, drafter, heldout_prompts, target, tokenizer
from generate import ModelRunner, generate_dflash

torch.set_grad_enabled(False)  # inference only

hidden = target.config.hidden_size
prompts = heldout_prompts(8)


def runner_keeping(keep):
    """A runner class whose drafter sees the features multiplied by `keep` (F,): 1 to keep a number, 0 to zero it."""

    class MaskedRunner(ModelRunner):
        def draft(self, context_features, *args, **kwargs):
            return super().draft(context_features * keep, *args, **kwargs)  # (1, ctx, F) * (F,)

    return MaskedRunner


def pooled_tau(runner_class):
    lengths = []
    for ids in prompts:
        runner = runner_class(target, drafter, max_length=len(ids) + 96 + block)
        lengths += generate_dflash(target, drafter, ids, 96, stop_ids=tokenizer.stop_token_ids,
                                   runner=runner).acceptance_lengths
    return sum(lengths) / len(lengths)


def tau_with_one_layer():
    taus = {}
    for index, layer in enumerate(drafter.config.target_layer_ids):  # features: layer after layer, `hidden` wide each
        keep = torch.zeros(len(drafter.config.target_layer_ids) * hidden)
        keep[index * hidden:(index + 1) * hidden] = 1.0
        taus[layer] = pooled_tau(runner_keeping(keep))
    return taus


width = len(drafter.config.target_layer_ids) * hidden
tau_both = pooled_tau(ModelRunner)
tau_none = pooled_tau(runner_keeping(torch.zeros(width)))
alone = tau_with_one_layer()
print(", ".join(f"layer {layer} alone: tau {tau:.2f}" for layer, tau in alone.items())
      + f"; both: {tau_both:.2f}; neither: {tau_none:.2f}")
assert all(tau_none < tau < tau_both for tau in alone.values()), "each layer alone helps, but less than both"
print("checks passed")
