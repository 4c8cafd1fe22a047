"""Grades lab 02_tau_past_the_end against a simulation: one long greedy run's step lengths, replayed with each
limit (greedy, every shorter run takes the same steps and stops where its output is full or stopped)."""

from generate import generate_dflash

LIMITS = range(2, 41)


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
    prompt_ids = demo.prompts(1)[0][0]
    mine = lab.past_the_end(demo, prompt_ids, LIMITS)  # an unwritten starter stops here, before the models load
    long = generate_dflash(demo.target, demo.drafter, prompt_ids, max(LIMITS) + demo.block, stop_ids=demo.stop_ids)
    stopped = long.new_ids[-1] in demo.stop_ids
    answer_length = long.new_tokens if stopped else max(LIMITS) + demo.block
    expected = replayed_counts(long.acceptance_lengths, answer_length, LIMITS)
    assert list(mine) == expected, (f"02_tau_past_the_end: counts {list(mine)}; replaying one long run's steps "
                                    f"gives {expected} (limit {LIMITS[0]} first)")
