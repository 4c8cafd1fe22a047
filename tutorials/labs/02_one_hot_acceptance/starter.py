"""Lab 02_one_hot_acceptance (notebook 2, section 4): the probability that the first step keeps
its one-hot first draft, predicted from the target's exact probabilities and measured by running the loop.

Write the function below, then grade it: python -m pytest tutorials/labs -k one_hot_acceptance
"""

import torch  # noqa: F401


def first_draft_kept(tiny, samples: int) -> tuple[float, float]:
    """(predicted, measured) probability that the first step keeps its first draft, in notebook 2's section 4.

    `tiny` holds that experiment: `target`, `drafter`, `prompt`, `vocab`, `temperature`,
    `generate_dflash` (the loop to run: it takes what generate.generate_dflash takes),
    `GreedyGuessRunner` (its drafts are the target's greedy continuation of `runner.committed`,
    which your loop's `on_token` must keep up to date) and `next_probabilities(prefixes)`: the
    target's exact next-token law after prompt + each prefix, (len(prefixes), vocab).

    Predicted: from the target's exact laws alone (no sampling): the first step drafts after the
    prefill's token t1, and keeps its first draft when the target's own next sample equals it. Which
    t1 can occur, and what is the chance of a match after each? Measured: run tiny.generate_dflash
    (3 new tokens, temperature tiny.temperature, a torch.Generator seeded 0,
    runner=GreedyGuessRunner(...)) `samples` times, and count the runs whose first step kept its
    first draft."""
    raise NotImplementedError
