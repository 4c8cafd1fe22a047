"""Lab 03_one_position (notebook 3, section 6): every mask slot at one position.

Write the function below, then grade it: python -m pytest tutorials/labs -k one_position
"""

import torch  # noqa: F401


def guesses_at_one_position(pair, prompt_ids: list[int]) -> list[int]:
    """The drafter's block - 1 guesses (token ids) after the prompt when every mask slot sits at one position.

    As notebook 3's section 5 traces it: run the target over the prompt (n tokens) capturing the layers
    `pair.drafter.config.target_layer_ids`; its greedy next token opens the block [that token, MASK, ...]
    (`pair.drafter.config.mask_token_id`); call
    `pair.drafter(features, pair.target.embed_tokens(block_ids), context_positions, block_positions)`
    with the context at 0..n-1, slot 0 at n and *every* mask slot at n + 1; the guesses are the argmax of
    `pair.target.logits` over the mask slots' outputs. Why must they all be the same token?
    """
    raise NotImplementedError
