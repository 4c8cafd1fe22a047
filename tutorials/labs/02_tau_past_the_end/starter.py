"""Lab 02_tau_past_the_end (notebook 2, section 2): how many tokens tau counts past the end.

Write the function below, then grade it: python -m pytest tutorials/labs -k tau_past_the_end
"""

from generate import generate_dflash  # noqa: F401  (the loop to run)


def past_the_end(pair, prompt_ids: list[int], limits) -> list[int]:
    """For each max_new_tokens in `limits`, run `generate_dflash` on `prompt_ids` (stopping at
    `pair.stop_ids`) and count the tokens its steps verified past the output's end:
    sum(acceptance_lengths) - (new_tokens - 1) (the prefill made the first new token).

    `pair` has `target`, `drafter`, `tokenizer`, `stop_ids` and `block` (the block size). One count per limit.
    Why can a count never exceed block - 1? For which limits is it 0?
    """
    raise NotImplementedError
