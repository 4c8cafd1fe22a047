"""Grades lab 03_one_layer: each run's drafter must see its layer's features and no other's, and every layer
alone must draft worse than both and better than none, on the same prompts."""

import torch

from _lab_helpers import WatchedPooledTau
from generate import ModelRunner


class Blind(ModelRunner):
    def draft(self, features, *args, **kwargs):
        return super().draft(torch.zeros_like(features), *args, **kwargs)


def test_one_layer(lab, demo):
    pooled_tau = WatchedPooledTau(demo)
    alone = lab.tau_with_one_layer(demo, pooled_tau)
    layers, hidden = demo.drafter.config.target_layer_ids, demo.target.config.hidden_size
    assert sorted(alone) == sorted(layers), f"03_one_layer: one tau per target layer {layers}, got {sorted(alone)}"
    for layer, tau in alone.items():
        assert tau in pooled_tau.taus, f"03_one_layer: return the tau pooled_tau gave you for layer {layer}"
        seen = pooled_tau.seen[pooled_tau.taus.index(tau)]  # (F,): the columns that run's drafter saw nonzero
        own = slice(layers.index(layer) * hidden, (layers.index(layer) + 1) * hidden)
        others = torch.ones_like(seen)
        others[own] = False
        assert seen[own].any() and not seen[others].any(), \
            f"03_one_layer: the run for layer {layer} should see that layer's {hidden} columns only"
    both, none = pooled_tau(ModelRunner), pooled_tau(Blind)
    assert all(none < tau < both for tau in alone.values()), \
        f"03_one_layer: each layer alone should help, but less than both: {alone}, both {both:.2f}, none {none:.2f}"
