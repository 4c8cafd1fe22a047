"""Grades lab 03_zero_context: the runner's drafter passes must see only zeros, the tau returned must be that
run's, and it must collapse against the real drafter's on the same prompts."""

from _lab_helpers import WatchedPooledTau
from generate import ModelRunner


def test_zero_context(lab, demo):
    pooled_tau = WatchedPooledTau(demo)
    blind = lab.tau_without_context(demo, pooled_tau)
    assert pooled_tau.taus, "03_zero_context: return pooled_tau(YourRunner): it runs the loop with your runner"
    assert not pooled_tau.seen[-1].any(), \
        f"03_zero_context: the drafter still saw {int(pooled_tau.seen[-1].sum())} nonzero feature columns"
    assert blind == pooled_tau.taus[-1], "03_zero_context: return the tau pooled_tau gives for your runner"
    real = pooled_tau(ModelRunner)
    assert blind < real / 2, f"03_zero_context: tau {blind:.2f} without the features, {real:.2f} with: no collapse?"
