"""Grades lab 06_token_healing against the project's Tokenizer.heal on raw prompts cut in the middle of a word,
with Tokenizer.heal (and the helper it uses) switched off while the student's function runs."""

from _lab_helpers import switched_off
from dflash.tokenizer import Tokenizer

CUT = ["Mia has 14 apples. She buys 9 more. How many app", "Tom has 7 cards. Ana has twice as many ca",
       "Leo buys 3 pens that cost 4 dollars each. He pays with 20 dol", "She has 9 ma", "The answer is"]
RULE = "06_token_healing: the lab asks you to heal by hand"


def test_token_healing(lab, demo):
    tokenizer = demo.tokenizer
    for text in CUT:
        ids = tokenizer.encode(text)
        healed, choices = tokenizer.heal(ids)
        if choices is None:  # nothing to heal: a word that ends cleanly
            continue
        with switched_off(RULE, {Tokenizer: ["heal", "tokens_starting_with"]}):
            mine = lab.heal_by_hand(tokenizer, ids)
        assert list(mine[0]) == healed, f"06_token_healing: {text!r}: drop the last token only"
        assert sorted(mine[1]) == choices, (
            f"06_token_healing: {text!r}: {len(mine[1])} choices; Tokenizer.heal finds {len(choices)} "
            f"(missing {[tokenizer.decode([i]) for i in sorted(set(choices) - set(mine[1]))][:5]}, "
            f"extra {[tokenizer.decode([i]) for i in sorted(set(mine[1]) - set(choices))][:5]})")
