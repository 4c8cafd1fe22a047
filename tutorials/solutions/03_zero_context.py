"""Notebook 3, exercise 1: the drafter without the target's features; the drafts and tau collapse.

Run from tutorials/: python solutions/03_zero_context.py
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
block = drafter.config.block_size
heldout = [json.loads(line) for line in (ROOT / "weights/heldout_problems.jsonl").read_text().splitlines()[:8]]
prompts = [tokenizer.encode_chat(record["messages"]) for record in heldout]


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
