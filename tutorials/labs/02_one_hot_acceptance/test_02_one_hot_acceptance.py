"""Grades lab 02_one_hot_acceptance: the prediction against a Monte Carlo simulation of the first step's two
draws (t1, then t2 after it), and the measurement against the prediction, both within their sampling error.
The runs are counted: a measurement must come from `samples` runs of the loop."""

import torch

from _lab_helpers import drawn_seed, tiny_experiment

SIMULATED = 200_000


def simulated_keep_rate(tiny) -> tuple[float, float]:
    """(rate, standard error): draw t1, then t2 after it, from the exact laws; kept when t2 is the greedy guess."""
    generator = torch.Generator().manual_seed(1)
    p1 = tiny.next_probabilities([()])[0]  # (vocab,)
    p2 = tiny.next_probabilities([(a,) for a in range(tiny.vocab)])  # (vocab, vocab)
    t1 = torch.multinomial(p1, SIMULATED, replacement=True, generator=generator)  # (SIMULATED,)
    t2 = torch.multinomial(p2[t1], 1, generator=generator)[:, 0]  # (SIMULATED,): one draw after each t1
    kept = (t2 == p2.argmax(-1)[t1]).double().mean().item()
    return kept, (kept * (1 - kept) / SIMULATED) ** 0.5


def telling_experiment(seed: int):
    """A tiny target drawn from `seed` on, whose first step's keep rate depends on the law of its
    first token: far from its likeliest first token's rate, and from a uniform first token's."""
    for offset in range(1000):
        tiny = tiny_experiment((seed + offset) % 1000)
        p1 = tiny.next_probabilities([()])[0]  # (vocab,)
        p2 = tiny.next_probabilities([(a,) for a in range(tiny.vocab)])  # (vocab, vocab)
        best = p2.max(dim=-1).values  # (vocab,): the keep rate after each first token
        averaged, likeliest, uniform = (p1 * best).sum(), best[p1.argmax()], best.mean()
        if min(abs(averaged - likeliest), abs(averaged - uniform)) > 0.05:  # >> 5 standard errors
            return tiny
    raise AssertionError("no tiny target tells the first tokens apart")


def test_one_hot_acceptance(lab):
    seed = drawn_seed()
    tiny = telling_experiment(seed % 1000)  # a tiny target drawn at run time, and a number of samples
    samples = 250 + seed % 100
    runs = []
    original = tiny.GreedyGuessRunner.prefill

    def counted(self, *args, **options):  # a run of the loop opens with one prefill
        runs.append(1)
        return original(self, *args, **options)

    tiny.GreedyGuessRunner.prefill = counted
    predicted, measured = lab.first_draft_kept(tiny, samples)
    simulated, error = simulated_keep_rate(tiny)
    high = "too high" if predicted > simulated else "too low"
    assert abs(predicted - simulated) < 5 * error + 1e-3, (
        f"02_one_hot_acceptance: predicted {predicted:.4f}, more than 5 standard errors from a "
        f"simulation of the two draws ({high}): which first tokens can occur?")
    assert len(runs) == samples, \
        f"02_one_hot_acceptance: {len(runs)} runs of the loop, not {samples}"
    sigma = (predicted * (1 - predicted) / samples) ** 0.5  # the measurement's binomial deviation
    assert abs(measured * samples - round(measured * samples)) < 1e-9, \
        "02_one_hot_acceptance: a share of the runs"
    assert abs(measured - predicted) < 4 * sigma, (
        f"02_one_hot_acceptance: measured {measured:.3f}, more than 4 standard deviations "
        f"from your prediction")
