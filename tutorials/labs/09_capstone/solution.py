"""Lab 09_capstone, the reference answer: the speculative loop, from the runner's passes."""

import torch

from dflash.qwen3 import argmax
from dflash.sampling import Sampling


def my_generate_dflash(runner, prompt_ids: list[int], max_new_tokens: int,
                       stop_ids=()) -> tuple[list[int], list[int]]:
    """(new_ids, acceptance_lengths) of greedy DFlash decoding with `runner`."""
    if max_new_tokens == 0:
        return [], []  # no token asked for: not even the prefill's
    block = runner.block_size
    last, features = runner.prefill(prompt_ids, Sampling(), None)  # int, (1, n, F)
    new_ids, lengths = [last], []
    while len(new_ids) < max_new_tokens and new_ids[-1] not in stop_ids:
        drafts = argmax(runner.draft(features, last))  # (block - 1,): the drafter's likeliest
        target_tokens, features = runner.verify(drafts)  # (block,), (1, block, F)
        both = torch.cat([drafts, target_tokens]).tolist()  # one host sync
        drafts, target_tokens = both[:block - 1], both[block - 1:]
        accepted = 0  # the drafts before the first one the target disagrees with
        while accepted < block - 1 and drafts[accepted] == target_tokens[accepted]:
            accepted += 1
        features = runner.commit(accepted + 1)  # `last` and the accepted drafts
        lengths.append(accepted + 1)  # the accepted drafts and the target's own token after them
        for token in target_tokens[:accepted + 1]:
            if len(new_ids) == max_new_tokens or new_ids[-1] in stop_ids:
                break
            new_ids.append(token)
        last = target_tokens[accepted]  # the target's token opens the next block
    return new_ids, lengths
