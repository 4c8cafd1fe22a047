"""Notebook 5, exercise 1: tau and the per-slot acceptance from the acceptance histogram alone.

Run from tutorials/: python solutions/05_histogram.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from dflash.results import Generation, acceptance_histogram, per_position_acceptance
from generate import generate_dflash

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
WEIGHTS = Path.cwd().parent / "weights"
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
B = drafter.config.block_size


def tau_from_histogram(histogram):
    """histogram[i] steps committed i + 1 tokens: the mean step length."""
    return sum((i + 1) * count for i, count in enumerate(histogram)) / sum(histogram)


def per_slot_from_histogram(histogram):
    """For draft slot k = 1..B-1: a step of length L reached slot k when L >= k, and kept it when L > k."""
    rates = []
    for slot in range(1, len(histogram)):
        reached = sum(histogram[slot - 1:])  # lengths slot .. B
        kept = sum(histogram[slot:])  # lengths slot + 1 .. B
        rates.append(kept / reached if reached else None)
    return rates


lengths = []
for prompt in read_prompts(WEIGHTS / "heldout_problems.jsonl")[:8]:  # section 3's runs
    ids, choices = encode_for_generation(prompt, tokenizer)
    lengths += generate_dflash(target, drafter, ids, 96, stop_ids=tokenizer.stop_token_ids,
                               first_token_choices=choices).acceptance_lengths
histogram = acceptance_histogram(lengths, B)
tau = Generation([], lengths, 0.0).mean_acceptance
print(f"histogram {histogram}: tau {tau_from_histogram(histogram):.4f} (from the lengths: {tau:.4f})")
print("per slot:", [None if r is None else round(r, 3) for r in per_slot_from_histogram(histogram)])
assert abs(tau_from_histogram(histogram) - tau) < 1e-12, "the same tau"
assert per_slot_from_histogram(histogram) == per_position_acceptance(lengths, B), "the same per-slot rates"
print("checks passed")
