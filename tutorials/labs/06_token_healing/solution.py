"""Lab 06_token_healing, the reference answer (notebook 6, section 2): token healing by hand."""


def heal_by_hand(tokenizer, ids: list[int]) -> tuple[list[int], list[int]]:
    """(the prompt without its last token, the ids whose text starts with that token's text), as Tokenizer.heal."""
    dropped = tokenizer.decode([ids[-1]])
    choices = [i for i in range(tokenizer.vocab_size)
               if i not in tokenizer.special_ids and tokenizer.decode([i]).startswith(dropped)]
    return ids[:-1], choices
