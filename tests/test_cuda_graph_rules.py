"""The runner's compiled passes obey CUDA graphs' rule on outputs, checked on the CPU.

With `torch.compile(mode="reduce-overhead")`, a compiled function replays a CUDA
graph whose outputs live in memory the next replay may reuse: a tensor returned by
one call can be overwritten by the next compiled call. Whatever the loop keeps past
the next pass (the drafts, read again after verification; the features, read by
the next draft; the tokens) must therefore be copied out first. No GPU has run this
code here, so the rule is emulated: every call of a wrapped pass first fills every
tensor that any earlier call returned with garbage (NaN, or -1 for token ids).
"""

from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from generate import ModelRunner, generate_autoregressive, generate_dflash
from tests.test_generate import prompt_of, random_drafter

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
torch.set_num_threads(1)


class OverwriteEarlierOutputs:
    """A torch.compile backend that runs each captured graph as is, but first spoils every output of
    every earlier call, as CUDA graphs may."""

    def __init__(self):
        self.returned: list[torch.Tensor] = []
        self.calls = 0

    def spoil(self) -> None:
        for tensor in self.returned:
            tensor.fill_(float("nan") if tensor.is_floating_point() else -1)

    def __call__(self, graph_module, example_inputs):
        def call(*args):
            self.spoil()
            out = graph_module.forward(*args)
            self.calls += 1
            self.returned += [t for t in out if isinstance(t, torch.Tensor)]
            return out

        return call


def runner_under_the_rule(target, drafter, max_length: int,
                          block_size: int) -> tuple[ModelRunner, OverwriteEarlierOutputs]:
    rule = OverwriteEarlierOutputs()
    runner = ModelRunner(target, drafter, max_length=max_length, block_size=block_size, compile=True,
                         backend=rule)
    return runner, rule


def test_the_emulation_spoils_what_an_earlier_call_returned():
    rule = OverwriteEarlierOutputs()
    double = torch.compile(lambda x: 2 * x, backend=rule)
    first = double(torch.ones(3))
    double(torch.ones(3))
    assert torch.isnan(first).all()


@pytest.fixture(scope="module")
def pairs():
    sharded = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    tiny = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    demo = Qwen3.from_pretrained(ROOT / "weights" / "tiny-qwen3")
    return {
        "fixtures": (sharded, Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=sharded)),
        "random": (tiny, random_drafter(tiny, block_size=16)),
        "demo": (demo, Drafter.from_pretrained(ROOT / "weights" / "tiny-qwen3-dflash", target=demo)),
    }


@pytest.mark.parametrize("pair_name, block_size", [("fixtures", 8), ("random", 5), ("demo", 16)])
def test_greedy_dflash_equals_the_plain_loop_under_the_rule(pairs, pair_name, block_size):
    torch._dynamo.reset()
    target, drafter = pairs[pair_name]
    new = 24
    runner, rule = runner_under_the_rule(target, drafter, 31 + new + block_size, block_size)
    for prompt_length in (1, 6, 31):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        expected = generate_autoregressive(target, prompt, new).new_ids
        eager = generate_dflash(target, drafter, prompt, new, block_size=block_size)
        spoiled = generate_dflash(target, drafter, prompt, new, runner=runner)
        assert spoiled.new_ids == eager.new_ids == expected
        # Spoiled features or drafts would not change the output (wrong drafts are only
        # rejected) but would change what was accepted: compare that too.
        assert spoiled.acceptance_lengths == eager.acceptance_lengths
        assert generate_autoregressive(target, prompt, new, runner=runner).new_ids == expected
    assert rule.calls > 10  # the compiled passes did run, and spoiled what they had returned before
    torch._dynamo.reset()


@pytest.mark.parametrize("policy", ["greedy", "sampled", "mixed:3"])
def test_sampling_with_every_draft_policy_is_unchanged_under_the_rule(pairs, policy):
    """The same seed gives the same sampled output eagerly and under the rule: the drafter's q (kept for the
    verdicts) and the target's logits are consumed before a later pass can spoil them."""
    torch._dynamo.reset()
    target, drafter = pairs["demo"]
    new, block_size = 24, 16
    sampling = Sampling(1.0, top_k=20, top_p=0.8)
    runner, rule = runner_under_the_rule(target, drafter, 31 + new + block_size, block_size)
    for prompt_length in (6, 31):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        outputs = [generate_dflash(target, drafter, prompt, new, sampling=sampling, draft_policy=policy,
                                   generator=torch.Generator().manual_seed(7), runner=chosen)
                   for chosen in (None, runner)]
        assert outputs[0].new_ids == outputs[1].new_ids
        assert outputs[0].acceptance_lengths == outputs[1].acceptance_lengths
    assert rule.calls > 10
    torch._dynamo.reset()
