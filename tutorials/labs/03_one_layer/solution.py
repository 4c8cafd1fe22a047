"""Lab 03_one_layer, the reference answer (notebook 3, section 1): the drafter with one target layer's features."""

import torch

from generate import ModelRunner


def runner_keeping(keep: torch.Tensor) -> type:
    """A runner class whose drafter sees the features multiplied by `keep` (F,): 1 to keep a number, 0 to zero it."""

    class MaskedRunner(ModelRunner):
        def draft(self, features, *args, **kwargs):
            return super().draft(features * keep, *args, **kwargs)  # (1, ctx, F) * (F,)

    return MaskedRunner


def tau_with_one_layer(pair, pooled_tau) -> dict[int, float]:
    layers, hidden = pair.drafter.config.target_layer_ids, pair.target.config.hidden_size
    taus = {}
    for index, layer in enumerate(layers):  # features: layer after layer, `hidden` wide each
        keep = torch.zeros(len(layers) * hidden)
        keep[index * hidden:(index + 1) * hidden] = 1.0
        taus[layer] = pooled_tau(runner_keeping(keep))
    return taus
