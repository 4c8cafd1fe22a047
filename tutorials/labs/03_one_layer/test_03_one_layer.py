"""Grades lab 03_one_layer: each run's drafter must see its layer's features and no other's, and
every layer alone must draft worse than both and better than none, on the same prompts. The
layers are checked on the fixture pair too (other layer ids and width): ids written down from
the demo pair fail."""

import torch

from _lab_helpers import WatchedPooledTau, fixture_pair
from generate import ModelRunner


class Blind(ModelRunner):
    def draft(self, features, *args, **kwargs):
        return super().draft(torch.zeros_like(features), *args, **kwargs)


def assert_each_run_sees_its_layer(lab, pair, pooled_tau: WatchedPooledTau) -> dict:
    """The student's runs on `pair`: a tau per target layer, each from a run that saw that layer's
    columns alone. A tau is matched to its run by its value where the runs' taus differ, and by the
    columns each run saw where they do not (a random pair's drafter keeps no draft)."""
    alone = lab.tau_with_one_layer(pair, pooled_tau)
    layers, hidden = pair.drafter.config.target_layer_ids, pair.target.config.hidden_size
    assert sorted(alone) == sorted(layers), f"03_one_layer: one tau per target layer {layers}, got {sorted(alone)}"

    def sees_only(seen: torch.Tensor, layer: int) -> bool:
        own = slice(layers.index(layer) * hidden, (layers.index(layer) + 1) * hidden)
        others = torch.ones_like(seen)
        others[own] = False
        return bool(seen[own].any() and not seen[others].any())

    for layer, tau in alone.items():
        assert tau in pooled_tau.taus, \
            f"03_one_layer: return the tau pooled_tau gave you for layer {layer}"
        runs = [seen for seen, run_tau in zip(pooled_tau.seen, pooled_tau.taus) if run_tau == tau]
        assert any(sees_only(seen, layer) for seen in runs), \
            f"03_one_layer: the run for layer {layer} should see that layer's {hidden} columns only"
    return alone


def test_one_layer(lab, demo):
    pooled_tau = WatchedPooledTau(demo)
    alone = assert_each_run_sees_its_layer(lab, demo, pooled_tau)
    # a pair with other layer ids, width and block size: nothing of the demo's may be written down
    other = fixture_pair()
    assert_each_run_sees_its_layer(lab, other, WatchedPooledTau(other, prompts=1, max_new_tokens=8))
    both, none = pooled_tau(ModelRunner), pooled_tau(Blind)
    assert all(none < tau < both for tau in alone.values()), \
        f"03_one_layer: each layer alone should help, but less than both: {alone}, both {both:.2f}, none {none:.2f}"
