"""Grades lab 04_gamma through train.py's own option parser and weights: the "decay" run must weigh the slots as
train.py does by default for blocks of 8, the "none" run every labelled slot as 1, with nothing else changed.
`short_run` here records the options instead of training (notebook 4 trains; that takes a minute a run)."""

import torch

import train

BLOCK = 8
BASE = ["--target", "t", "--data", "d", "--out", "o", "--block-size", str(BLOCK)]


def weights_of(options) -> tuple[torch.Tensor, dict]:
    """The slot weights train.py uses under `options`, and every other option's value."""
    args = vars(train.build_parser().parse_args(BASE + list(options)))
    gamma = args.pop("gamma")
    return train.slot_weights(BLOCK, gamma or train.gamma_for_block_size(BLOCK)), args


def test_gamma(lab):
    runs = {}

    def short_run(name, *options):
        runs[name] = options
        return {"run": name}, float(len(runs))  # what a run returns: its last log line and its tau

    result = lab.compare_decay(short_run)
    assert len(runs) == 2 and sorted(result) == ["decay", "none"], \
        "04_gamma: two short runs, returned as {'decay': ..., 'none': ...}"
    names = {line["run"]: key for key, (line, _) in result.items()}
    default_weights, default_args = weights_of([])
    decay, decay_args = weights_of(runs[next(n for n, key in names.items() if key == "decay")])
    none, none_args = weights_of(runs[next(n for n, key in names.items() if key == "none")])
    assert decay_args == default_args == none_args, "04_gamma: change the decay only, no other option"
    assert torch.allclose(decay, default_weights), \
        f"04_gamma: the decay run weighs the slots {decay.tolist()}, not as the paper for blocks of 8"
    assert torch.allclose(none[1:], torch.ones(BLOCK - 1), atol=1e-6, rtol=0), \
        f"04_gamma: without decay every labelled slot weighs 1, not {none[1:].tolist()}"
