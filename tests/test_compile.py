"""Compiled steps compile once per bucket of cache slots read: no recompilation across prompts, positions or
acceptance lengths."""

from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from generate import ModelRunner, generate_autoregressive, generate_dflash, generate_dflash_tree
from tests.test_generate import oracle, prompt_of

FIXTURES = Path(__file__).parent / "fixtures"
WEIGHTS = Path(__file__).resolve().parents[1] / "weights"
torch.set_num_threads(1)


class CountingBackend:
    """A torch.compile backend that runs the captured graph as is and counts the captures."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.fixture
def no_recompiles():
    torch._dynamo.reset()
    before = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    yield
    torch._dynamo.config.error_on_recompile = before
    torch._dynamo.reset()


def test_steps_compile_once_whatever_the_acceptance(no_recompiles):
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    drafter = Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)
    backend, block_size, new = CountingBackend(), 8, 24
    runner = ModelRunner(target, drafter, max_length=40 + new + block_size, compile=True, backend=backend)
    runs = [(5, lambda position: position % 3 == 0), (23, lambda position: position % 5 == 2), (40, lambda _: False),
            (40, lambda position: position % 2 == 0)]
    counts, lengths = [], []
    for prompt_length, wrong_at in runs:
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
        assert generate_autoregressive(target, prompt, new, runner=runner).new_ids == truth[prompt_length:][:new]
        guessing, _ = oracle(runner, truth, wrong_at)
        result = generate_dflash(target, drafter, prompt, new, runner=guessing)
        assert result.new_ids == truth[prompt_length:][:new]
        counts.append(backend.graphs)
        lengths += result.acceptance_lengths
    assert counts[0] == 3  # decode, verify, draft: one graph each, all reading the first bucket (64 slots)
    assert counts[1] == 3
    # The longest prompt's passes also read the second bucket (72 slots, the whole buffer); whatever the acceptance,
    # no pass ever compiles a third graph.
    assert 3 < counts[2] <= counts[3] <= 6
    assert len(set(lengths)) >= 3  # the steps did run with different acceptance lengths


def test_runners_share_compiled_passes_and_many_shapes_stay_under_the_recompile_limit(no_recompiles):
    """Each pass compiles once per process and runner shape, not once per runner; and a benchmark's many
    shapes (block sizes, greedy and sampled) never pile up in one function's cache.

    With dynamo's per-function recompile limit at 2, compiling every runner's own
    methods failed at the third graph of `verify`; here each shape has its own copy.
    """
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    drafter = Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)
    backend, new, prompt = CountingBackend(), 12, prompt_of(7, target.config.vocab_size)
    truth = generate_autoregressive(target, prompt, new).new_ids
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit, torch._dynamo.config.error_on_recompile = 2, False
    try:
        counts = []
        for block_size in (4, 8, 4, 8):
            runner = ModelRunner(target, drafter, max_length=7 + new + 8, block_size=block_size, compile=True,
                                 backend=backend)
            for temperature in (0.0, 0.7):
                generator = torch.Generator().manual_seed(0)
                plain = generate_autoregressive(target, prompt, new, runner=runner, sampling=Sampling(temperature),
                                                generator=generator)
                generator = torch.Generator().manual_seed(0)
                fast = generate_dflash(target, drafter, prompt, new, runner=runner, sampling=Sampling(temperature),
                                       generator=generator)
                assert temperature > 0 or plain.new_ids == fast.new_ids == truth
            counts.append(backend.graphs)
    finally:
        torch._dynamo.config.recompile_limit = limit
    assert counts[2:] == [counts[1]] * 2  # the third and fourth runners compile nothing
    assert counts[0] == 3  # decode, verify, draft: logits, greedy or sampled, so one graph each


# Prompt lengths in an order that crosses the buckets of cache slots (64, 128, 256, 512) both ways: a short
# prompt leaves a small bucket behind, the next long one must not read it; a long one leaves a large one.
SHUFFLED_LENGTHS = (5, 150, 9, 70, 3, 230, 40)


@pytest.fixture(scope="module")
def demo_pair():
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    return target, Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)


@pytest.mark.parametrize("kind", ["chain", "tree", "sampled"])
def test_a_compiled_runner_reused_across_prompts_reads_what_each_prompt_needs(demo_pair, kind):
    """One compiled runner (the eager backend: the same shapes and bucketed reads, no build time) serves
    prompts of shuffled lengths; every output equals what a fresh eager runner gives for that prompt.

    The eager passes between compiled ones (the prefill, the first draft) once read the slot count the
    last compiled pass left: a 150-token prompt after a 5-token one attended to its first 64 keys only.
    """
    target, drafter = demo_pair
    new, budget = 24, 6 if kind == "tree" else 0
    runner = ModelRunner(target, drafter, max_length=max(SHUFFLED_LENGTHS) + new + 16, tree_budget=budget,
                         compile=True, backend="eager")
    for length in SHUFFLED_LENGTHS:
        prompt = prompt_of(length, target.config.vocab_size)
        if kind == "chain":
            plain = generate_autoregressive(target, prompt, new).new_ids
            assert generate_autoregressive(target, prompt, new, runner=runner).new_ids == plain, length
            assert generate_dflash(target, drafter, prompt, new, runner=runner).new_ids == plain, length
        elif kind == "tree":
            plain = generate_autoregressive(target, prompt, new).new_ids
            reused = generate_dflash_tree(target, drafter, prompt, new, budget=budget, runner=runner)
            assert reused.new_ids == plain, length
        else:  # sampled drafts, same seed: the same draws as a fresh eager runner
            runs = [generate_dflash(target, drafter, prompt, new, sampling=Sampling(0.8), draft_policy="sampled",
                                    generator=torch.Generator().manual_seed(length), runner=each)
                    for each in (runner, None)]
            assert runs[0].new_ids == runs[1].new_ids, length
            assert runs[0].acceptance_lengths == runs[1].acceptance_lengths, length
