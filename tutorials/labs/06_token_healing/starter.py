"""Lab 06_token_healing (notebook 6, section 2): token healing by hand.

Write the function below, then grade it: python -m pytest tutorials/labs -k token_healing
"""


def heal_by_hand(tokenizer, ids: list[int]) -> tuple[list[int], list[int]]:
    """(the prompt without its last token, every token id whose text starts with that token's text).

    Scan the whole vocabulary (`tokenizer.vocab_size` ids, `tokenizer.decode([i])` is one token's text),
    leaving out the special tokens (`tokenizer.special_ids`). The grader compares with `tokenizer.heal`,
    and switches it off while your function runs.
    """
    raise NotImplementedError
