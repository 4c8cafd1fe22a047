"""Lab 03_one_position, the reference answer (notebook 3, section 6): every mask slot at one position.

Mask slots that share a position share everything: the same embedding, the same RoPE angle, so the
same query, key and value in the first layer; their attention rows see the same keys, so their outputs
are equal, and so on up every layer. Position is what tells them apart.
"""

import torch


def guesses_at_one_position(pair, prompt_ids: list[int]) -> list[int]:
    config, n = pair.drafter.config, len(prompt_ids)
    hidden, features = pair.target(torch.tensor([prompt_ids]), capture_layers=config.target_layer_ids)  # (1, n, F)
    last = pair.target.logits(hidden[0, -1]).argmax().item()  # the first new token, as the prefill picks it
    block_ids = torch.tensor([[last] + [config.mask_token_id] * (config.block_size - 1)])  # (1, block)
    positions = torch.tensor([n] + [n + 1] * (config.block_size - 1))  # (block,): every mask slot at n + 1
    out = pair.drafter(features, pair.target.embed_tokens(block_ids), torch.arange(n), positions)  # (1, block, hidden)
    return pair.target.logits(out[0, 1:]).argmax(dim=-1).tolist()  # (block - 1,)
