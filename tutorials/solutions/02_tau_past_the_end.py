"""Notebook 2, exercise 2: how many tokens tau counts past the end of the output, for limits 2..40.

Run from tutorials/: python solutions/02_tau_past_the_end.py
"""

import torch

from _demo_pair import block, drafter, heldout_prompts, target, tokenizer
from generate import generate_dflash

torch.set_grad_enabled(False)  # inference only

prompt_ids = heldout_prompts(1)[0]


def past_the_end(prompt_ids, limits):
    """Per limit: the tokens the steps verified after the output had ended (a stop token or the limit)."""
    counts = []
    for limit in limits:
        result = generate_dflash(target, drafter, prompt_ids, limit, stop_ids=tokenizer.stop_token_ids)
        counts.append(sum(result.acceptance_lengths) - (result.new_tokens - 1))  # the prefill made the first token
    return counts


limits = range(2, 41)
counts = past_the_end(prompt_ids, limits)
print("limit -> counted past the end:", dict(zip(limits, counts)))
assert all(0 <= count <= block - 1 for count in counts), "a step verifies at most block_size - 1 tokens past the end"
assert max(counts) > 0, "some limits end inside a step"
exact = [limit for limit, count in zip(limits, counts) if count == 0]
print(f"tau is exactly output tokens per step for limits {exact}: those where the output ends at a step's last token")

answer = generate_dflash(target, drafter, prompt_ids, 96, stop_ids=tokenizer.stop_token_ids).new_tokens
after = {count for limit, count in zip(limits, counts) if limit >= answer}  # limits the stop token reaches first
assert len(after) <= 1, "once the stop token ends the answer, the limit no longer matters"
print("checks passed")
