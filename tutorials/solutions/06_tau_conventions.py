"""Notebook 6, exercise 2: converting other tools' acceptance numbers into our tau.

Run from tutorials/: python solutions/06_tau_conventions.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/, generate.py

from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import generate_dflash


def tau_from_drafts(mean_drafts):
    """Our tau, from a tool's mean of accepted drafts per step (bonus excluded): add the bonus token back."""
    return mean_drafts + 1


def tau_from_rate(rate, block_size):
    """Our tau, from drafts accepted / drafts proposed: each step proposes block_size - 1 drafts, plus the bonus."""
    return rate * (block_size - 1) + 1


WEIGHTS = Path.cwd().parent / "weights"
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
B = drafter.config.block_size
ids, choices = encode_for_generation(read_prompts(WEIGHTS / "heldout_problems.jsonl")[0], tokenizer)
result = generate_dflash(target, drafter, ids, 96, stop_ids=tokenizer.stop_token_ids, first_token_choices=choices)
L = result.acceptance_lengths
tau = sum(L) / len(L)
mean_drafts = sum(k - 1 for k in L) / len(L)
rate = sum(k - 1 for k in L) / (len(L) * (B - 1))
assert abs(tau_from_drafts(mean_drafts) - tau) < 1e-9 and abs(tau_from_rate(rate, B) - tau) < 1e-9
assert tau_from_drafts(4.0) == 5.0  # a tool that excludes the bonus reports tau - 1: its 4 is our 5
print(f"tau {tau:.3f} = {mean_drafts:.3f} drafts per step + 1 = {rate:.3f} x {B - 1} + 1")
