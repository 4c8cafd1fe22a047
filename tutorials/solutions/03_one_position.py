"""Notebook 3, exercise 2: every mask slot at one position; the drafter then guesses one token for all.

Mask slots that share a position share everything: the same embedding, the same RoPE angle, so
the same query, key and value in the first layer; their attention rows see the same keys, so
their outputs are equal, and so on up every layer. Position is what tells them apart.

Run from tutorials/: python solutions/03_one_position.py
"""

import torch

from _demo_pair import block, drafter, heldout_prompts, target, tokenizer

torch.set_grad_enabled(False)  # inference only

dc = drafter.config
prompt_ids = heldout_prompts(1)[0]
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
