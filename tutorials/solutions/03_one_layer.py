"""Notebook 3, exercise 3: the drafter with one of its two target layers' features zeroed.

Run from tutorials/: python solutions/03_one_layer.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import ModelRunner, generate_dflash

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
ROOT = Path.cwd().parent
target = Qwen3.from_pretrained(ROOT / "weights/tiny-qwen3")
drafter = Drafter.from_pretrained(ROOT / "weights/tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(ROOT / "weights/tiny-qwen3")
block, hidden = drafter.config.block_size, target.config.hidden_size
heldout = [json.loads(line) for line in (ROOT / "weights/heldout_problems.jsonl").read_text().splitlines()[:8]]
prompts = [tokenizer.encode_chat(record["messages"]) for record in heldout]


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
