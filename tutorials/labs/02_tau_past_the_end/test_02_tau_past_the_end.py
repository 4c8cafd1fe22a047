"""Grades lab 02_tau_past_the_end against a simulation: one long greedy run's step lengths, replayed with each
limit (greedy, every shorter run takes the same steps and stops where its output is full or stopped)."""

from _lab_helpers import drawn_random, run_dflash


def replayed_counts(lengths: list[int], answer_length: int, limits) -> list[int]:
    """What each limit's run verifies past the end, from the long run's step lengths and its answer's length."""
    counts = []
    for limit in limits:
        written, verified, end = 1, 0, min(limit, answer_length)  # the prefill writes the first token
        for length in lengths:
            if written >= end:
                break
            verified += length
            written = min(written + length, end)
        counts.append(verified - (written - 1))
    return counts


def test_tau_past_the_end(lab, demo):
    rng = drawn_random()
    limits = sorted(rng.sample(range(2, 61), 16))  # drawn at run time, as is the prompt
    prompt_ids = demo.drawn_prompt(rng)
    # an unwritten starter stops here, models unloaded
    mine = list(lab.past_the_end(demo, prompt_ids, limits))
    assert len(mine) == len(limits), (
        f"02_tau_past_the_end: {len(mine)} counts for {len(limits)} limits"
    )
    long = run_dflash(demo.target, demo.drafter, prompt_ids, max(limits) + demo.block,
                      stop_ids=demo.stop_ids)
    stopped = long.new_ids[-1] in demo.stop_ids
    answer_length = long.new_tokens if stopped else max(limits) + demo.block
    expected = replayed_counts(long.acceptance_lengths, answer_length, limits)
    for limit, count, right in zip(limits, mine, expected):
        assert 0 <= count < demo.block, (
            f"02_tau_past_the_end: {count} at limit {limit}: a count lies between 0 and block - 1"
        )
        assert count == right, (
            f"02_tau_past_the_end: at limit {limit} your count ({count}) is not what replaying one "
            "long run's "
            f"steps gives: {'too many' if count > right else 'too few'}"
        )
