"""Lab 02_one_hot_acceptance, the reference answer (notebook 2, section 4): the one-hot draft's acceptance."""

import torch


def first_draft_kept(tiny, samples: int) -> tuple[float, float]:
    """(predicted, measured) probability that the first step keeps its first draft."""
    p1 = tiny.next_probabilities([()])[0]  # (vocab,): t1 after the prompt
    p2 = tiny.next_probabilities([(a,) for a in range(tiny.vocab)])  # (vocab, vocab): t2 after the prompt and t1 = a
    predicted = (p1 * p2.max(dim=-1).values).sum().item()  # the draft after t1 is argmax p2[t1]: kept w.p. max p2[t1]
    runner = tiny.GreedyGuessRunner(tiny.target, tiny.drafter, max_length=len(tiny.prompt) + 3 + 4)
    generator = torch.Generator().manual_seed(0)
    kept = 0
    for _ in range(samples):
        runner.committed[:] = tiny.prompt  # the runner's own list, refilled for each run
        result = tiny.generate_dflash(tiny.target, tiny.drafter, tiny.prompt, 3,
                                      temperature=tiny.temperature, generator=generator,
                                      runner=runner, on_token=lambda token, drafted:
                                      runner.committed.append(token))
        kept += result.acceptance_lengths[0] >= 2
    return predicted, kept / samples
