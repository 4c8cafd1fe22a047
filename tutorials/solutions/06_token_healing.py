"""Notebook 6, exercise 1: token healing by hand, checked against Tokenizer.heal.

Run from tutorials/: python solutions/06_token_healing.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/, generate.py

import torch

from dflash.prompts import Prompt, encode_for_generation
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer

WEIGHTS = Path.cwd().parent / "weights"
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")


def heal_by_hand(ids):
    """(the prompt without its last token, the ids whose text starts with that token's text), as Tokenizer.heal."""
    dropped = tokenizer.decode([ids[-1]])
    choices = [i for i in range(tokenizer.vocab_size)
               if i not in tokenizer.special_ids and tokenizer.decode([i]).startswith(dropped)]
    return ids[:-1], choices


example = Prompt("example", text="Mia has 14 apples. She buys 9 more. How many app")
ids, _ = encode_for_generation(example, tokenizer, chat=False, token_healing=False)  # raw text, cut mid-word
healed, choices = heal_by_hand(ids)
assert (healed, sorted(choices)) == tokenizer.heal(ids), "not what Tokenizer.heal returns"
print(f"dropped {tokenizer.decode([ids[-1]])!r}; {len(choices)} choices:", [tokenizer.decode([i]) for i in choices])

with torch.no_grad():
    hidden, _ = target(torch.tensor([healed]))  # (1, n - 1, hidden)
    logits = target.logits(hidden[0, -1])  # (vocab,)
restricted = torch.full_like(logits, float("-inf"))
restricted[choices] = logits[choices]
probabilities = restricted.softmax(-1)  # (vocab,): only the healing choices have mass
best = probabilities.argmax().item()
print(f"restricted to them, the likeliest first token is {tokenizer.decode([best])!r} ({probabilities[best]:.2f})")
assert tokenizer.decode([best]) == " apples", "healing should let the target finish the word"
