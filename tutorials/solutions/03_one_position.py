"""Notebook 3, exercise 2: every mask slot at one position; the drafter then guesses one token for all.

Mask slots that share a position share everything: the same embedding, the same RoPE angle, so
the same query, key and value in the first layer; their attention rows see the same keys, so
their outputs are equal, and so on up every layer. Position is what tells them apart.

Run from tutorials/: python solutions/03_one_position.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
ROOT = Path.cwd().parent
target = Qwen3.from_pretrained(ROOT / "weights/tiny-qwen3")
drafter = Drafter.from_pretrained(ROOT / "weights/tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(ROOT / "weights/tiny-qwen3")
dc, block = drafter.config, drafter.config.block_size
record = json.loads((ROOT / "weights/heldout_problems.jsonl").read_text().splitlines()[0])
prompt_ids = tokenizer.encode_chat(record["messages"])
n = len(prompt_ids)

hidden, target_features = target(torch.tensor([prompt_ids]), capture_layers=dc.target_layer_ids)  # (1, n, F)
last = target.logits(hidden[0, -1]).argmax().item()  # the first new token, as the prefill picks it
block_ids = torch.tensor([[last] + [dc.mask_token_id] * (block - 1)])  # (1, block)


def guesses(block_positions):
    embedded = target.embed_tokens(block_ids)  # (1, block, hidden)
    out = drafter(target_features, embedded, torch.arange(n), block_positions)  # (1, block, hidden)
    return target.logits(out[0, 1:]).argmax(dim=-1).tolist()  # (block - 1,)


def guesses_at_one_position():
    return guesses(torch.tensor([n] + [n + 1] * (block - 1)))


real = guesses(n + torch.arange(block))
same = guesses_at_one_position()
print("at their own positions:", [tokenizer.decode([t]) for t in real])
print("all at position n + 1: ", [tokenizer.decode([t]) for t in same])
assert len(set(same)) == 1, "mask slots that share a position share every vector: one guess for all"
assert len(set(real)) > 1, "at their own positions the slots guess different tokens"
print("checks passed")
