"""Compiled steps compile once: no recompilation across prompts, positions or acceptance lengths."""

from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from generate import ModelRunner, generate_autoregressive, generate_dflash
from tests.test_generate import oracle, prompt_of

FIXTURES = Path(__file__).parent / "fixtures"
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
    runs = [(5, lambda position: position % 3 == 0), (23, lambda position: position % 5 == 2), (40, lambda _: False)]
    counts, lengths = [], []
    for prompt_length, wrong_at in runs:
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
        assert generate_autoregressive(target, prompt, new, runner=runner).new_ids == truth[prompt_length:][:new]
        oracle(runner, truth, wrong_at)
        result = generate_dflash(target, drafter, prompt, new, runner=runner)
        del runner.draft  # back to the real method for the next run's oracle to wrap
        assert result.new_ids == truth[prompt_length:][:new]
        counts.append(backend.graphs)
        lengths += result.acceptance_lengths
    assert counts[0] == 3  # decode, verify, draft: one graph each
    assert counts == [3, 3, 3]
    assert len(set(lengths)) >= 3  # the steps did run with different acceptance lengths
