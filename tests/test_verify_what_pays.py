"""benchmarks/verify_what_pays.py: a step that verifies fewer drafts than its block stays lossless,
the policy follows the costs it is given, and the foreseeing bound keeps the full block's steps."""

import pytest
import torch

import generate
import verify_what_pays
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from test_cli import DRAFTER, TARGET

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair():
    target = Qwen3.from_pretrained(TARGET, dtype=torch.float32)
    return target, Drafter.from_pretrained(DRAFTER, target=target, dtype=torch.float32)


def costs(per_token: float) -> dict:
    return {"draft_fit_ms": {"overhead": 1.0, "per_token": 0.0},
            "verify_fit_ms": {"overhead": 1.0, "per_token": per_token}}


def run(pair, wrap, prompt):
    target, drafter = pair
    runner = generate.ModelRunner(target, drafter, max_length=len(prompt) + 80)
    return generate.generate_dflash(target, drafter, prompt, 40, runner=wrap(runner))


@pytest.mark.parametrize("per_token, length", [(100.0, 1), (0.0, 7)])  # the fixture: block 8
def test_the_policy_follows_the_costs_and_stays_lossless(pair, per_token, length):
    """Verified tokens that cost 100 times the overhead: the shortest length, every step; free
    ones: the longest. Either way the output is the plain loop's."""
    prompt = list(range(5, 25))
    plain = generate.generate_autoregressive(pair[0], prompt, 40)
    made = []

    def wrap(runner):
        made.append(verify_what_pays.VerifyWhatPays(runner, costs(per_token), [1, 3, 5, 7]))
        return made[-1]

    result = run(pair, wrap, prompt)
    assert result.new_ids == plain.new_ids
    assert set(made[0].chosen) == {length}
    assert max(result.acceptance_lengths) <= length + 1


def test_the_foreseeing_bound_keeps_the_full_blocks_steps(pair):
    prompt = list(range(30, 45))
    plain = generate.generate_autoregressive(pair[0], prompt, 60)
    full = run(pair, lambda runner: runner, prompt)
    seeing = run(pair, lambda runner: verify_what_pays.Foreseeing(
        runner, prompt + plain.new_ids, [1, 3, 5, 7]), prompt)
    assert seeing.new_ids == full.new_ids == plain.new_ids[:40]
    assert seeing.acceptance_lengths == full.acceptance_lengths
