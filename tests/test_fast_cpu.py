"""dflash/fast_cpu.py: the floor's arithmetic, the bytes a decode reads, the bandwidth probes, and
the fast path (inductor, weights frozen) giving the eager loops' tokens, compiled for real."""

from pathlib import Path

import pytest
import torch

from dflash import fast_cpu
from dflash.compiled import FROZEN
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3, Qwen3Config
from generate import ModelRunner, generate_autoregressive, generate_dflash
from tests.test_generate import oracle, prompt_of

FIXTURES = Path(__file__).parent / "fixtures"
torch.set_num_threads(1)


def test_floor_fields_are_the_time_to_read_the_weights_once():
    row = fast_cpu.floor_fields(weight_bytes=3_000_000_000, read_gb_per_s=12.0, decode_ms=500.0)
    assert row["floor_ms"] == pytest.approx(250.0)  # 3 GB at 12 GB/s
    assert row["decode_of_floor"] == pytest.approx(0.5)
    assert (row["weight_bytes"], row["read_gb_per_s"]) == (3_000_000_000, 12.0)


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_reads_every_weight_but_the_unread_embedding_rows(tied):
    config = Qwen3Config(vocab_size=500, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, tie_word_embeddings=tied)
    model = Qwen3(config).to(torch.bfloat16)
    every = sum(p.numel() for p in model.parameters()) * 2  # bf16: 2 bytes a weight
    embedding = 500 * 32 * 2
    expected = every if tied else every - embedding + 32 * 2  # untied: one row of it
    assert fast_cpu.decode_weight_bytes(model) == expected


def test_read_bandwidth_keeps_the_faster_probe():
    ticks = iter(range(1000))
    probes = fast_cpu.read_bandwidth(rounds=2, clock=lambda: next(ticks), size=2**20)
    assert probes["probe_bytes"] == 2**20
    assert probes["sum_gb_per_s"] > 0 and probes["gemv_gb_per_s"] > 0
    assert probes["read_gb_per_s"] == max(probes["sum_gb_per_s"], probes["gemv_gb_per_s"])


def test_runner_options_name_the_frozen_backend():
    assert fast_cpu.runner_options(False) == {"compile": False}
    assert fast_cpu.runner_options(True) == {"compile": True, "backend": FROZEN}
    assert fast_cpu.runner_options(True, "cuda") == {"compile": True, "mode": "reduce-overhead"}


@torch.no_grad()
def test_the_frozen_compiled_loops_give_the_eager_tokens():
    """The real compiler on the CPU: the plain loop and DFlash, compiled with the weights frozen,
    produce the eager plain loop's greedy tokens (DFlash with the right guesses offered)."""
    torch._dynamo.reset()
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    drafter = Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)
    block_size, new = 8, 16
    prompt = prompt_of(12, target.config.vocab_size)
    truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + 2 * block_size,
                         block_size=block_size, **fast_cpu.runner_options(True))
    plain = generate_autoregressive(target, prompt, new, runner=runner).new_ids
    guessing, _ = oracle(runner, truth, lambda position: position % 3 == 0)
    fast = generate_dflash(target, drafter, prompt, new, runner=guessing)
    assert plain == fast.new_ids == truth[len(prompt):][:new]
    assert max(fast.acceptance_lengths) > 1  # the verify and draft passes ran, compiled
    torch._dynamo.reset()
