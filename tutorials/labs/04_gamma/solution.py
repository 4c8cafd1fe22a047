"""Lab 04_gamma, the reference answer (notebook 4, section 5): the decay-weighted loss against no decay."""

import train

BLOCK = 8


def compare_decay(short_run) -> dict:
    """{"decay": (last log line, tau), "none": (last log line, tau)}: gamma 4 and no decay."""
    no_decay = 1e9  # exp(-(k-1)/1e9) is 1 to nine digits for every slot
    return {"decay": short_run("gamma4", "--gamma", str(train.gamma_for_block_size(BLOCK))),
            "none": short_run("no_decay", "--gamma", str(no_decay))}
