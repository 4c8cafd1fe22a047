"""Lab 02_tau_past_the_end, the reference answer (notebook 2, section 2): the tokens tau counts past the end."""


def past_the_end(pair, prompt_ids: list[int], limits) -> list[int]:
    """Per limit: the tokens the steps verified after the output had ended (a stop token or the limit)."""
    counts = []
    for limit in limits:
        result = pair.generate_dflash(pair.target, pair.drafter, prompt_ids,
                                      limit, stop_ids=pair.stop_ids)
        counts.append(sum(result.acceptance_lengths) - (result.new_tokens - 1))  # the prefill made the first token
    return counts
