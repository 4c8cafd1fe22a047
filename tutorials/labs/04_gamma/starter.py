"""Lab 04_gamma (notebook 4, section 5; a warm-up): the decay-weighted loss against no decay.

Write the function below, then grade it: python -m pytest tutorials/labs -k gamma
(In notebook 4, `short_run` trains for real: compare the runs' per-slot accuracy and real tau there.)
"""


def compare_decay(short_run) -> dict:
    """{"decay": short_run(...), "none": short_run(...)}: notebook 4's short run with the paper's decay for
    blocks of 8, and with no decay.

    `short_run(name, *options)` trains notebook 4's run (blocks of 8) under `name` with extra train.py
    options and returns (last log line, real tau). Slot k of the loss weighs exp(-(k - 1) / gamma) (train.py's
    `slot_weights`, option `--gamma`): which gamma does the paper use for blocks of 8 (train.py knows it), and
    which gamma makes every labelled slot weigh 1 (to six digits)?
    """
    raise NotImplementedError
