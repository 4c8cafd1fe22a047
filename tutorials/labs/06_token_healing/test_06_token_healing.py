"""Grades lab 06_token_healing against the project's Tokenizer.heal on raw prompts cut in the middle of a word,
with Tokenizer.heal (and the helper it uses) switched off while the student's function runs."""

from _lab_helpers import drawn_random, forbidden
from dflash.tokenizer import Tokenizer

RULE = "06_token_healing: the lab asks you to heal by hand"


def drawn_cuts(rng, problems: list[str]) -> list[str]:
    """Raw prompts cut at run time: held-out problems cut in the middle of a word, and ones ending
    in "<", the start of the special tokens' text (which healing must never offer)."""
    cuts = []
    for text in rng.sample(problems, 4):
        words = [
            i
            for i, c in enumerate(text)
            if c.isalpha() and 0 < i < len(text) - 1 and text[i + 1].isalpha()
        ]
        cuts.append(text[: rng.choice(words) + 1])
    text = rng.choice(problems)  # and one cut after a word's first letter: its last token has a space
    starts = [i for i in range(1, len(text)) if text[i - 1] == " " and text[i].isalpha()]
    cuts.append(text[: rng.choice(starts) + 1])
    return cuts + [rng.choice(problems)[: rng.randrange(10, 30)].rstrip() + " <", "The answer is"]


def test_token_healing(lab, demo):
    tokenizer = demo.tokenizer
    problems = [
        problem.messages[-1]["content"] for problem in demo.problems
    ]  # the questions, as raw text
    for text in drawn_cuts(drawn_random(), problems):
        ids = tokenizer.encode(text)
        healed, choices = tokenizer.heal(ids)
        if choices is None:  # nothing to heal: a word that ends cleanly
            continue
        with forbidden(lab, RULE, {Tokenizer: ["heal", "tokens_starting_with"]}):
            mine = lab.heal_by_hand(tokenizer, ids)
        assert list(mine[0]) == healed, f"06_token_healing: {text!r}: drop the last token only"
        extra, missing = sorted(set(mine[1]) - set(choices)), sorted(set(choices) - set(mine[1]))
        assert not extra, (
            f"06_token_healing: {text!r}: your choices include tokens that may not replace the "
            f"last one, e.g. {tokenizer.decode([extra[0]])!r}"
        )
        assert not missing, (
            f"06_token_healing: {text!r}: your choices miss {len(missing)} of the tokens that may"
        )
        assert len(mine[1]) == len(set(mine[1])), \
            f"06_token_healing: {text!r}: a choice listed twice"
