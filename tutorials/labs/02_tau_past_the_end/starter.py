"""Lab 02_tau_past_the_end (notebook 2, section 2): how many tokens tau counts past the end.

Write the function below, then grade it: python -m pytest tutorials/labs -k tau_past_the_end
"""


def past_the_end(pair, prompt_ids: list[int], limits) -> list[int]:
    """For each max_new_tokens in `limits`, run the DFlash loop on `prompt_ids` (stopping at
    `pair.stop_ids`) with `pair.generate_dflash` (it takes what generate.generate_dflash takes),
    and count the tokens its steps verified past the output's end:
    sum(acceptance_lengths) - (new_tokens - 1) (the prefill made the first new token).

    `pair` has `target`, `drafter`, `tokenizer`, `stop_ids`, `block` (the block size) and
    `generate_dflash` (the loop). One count per limit.
    Why can a count never exceed block - 1? For which limits is it 0?
    """
    raise NotImplementedError
