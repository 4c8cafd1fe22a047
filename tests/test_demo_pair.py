"""The shipped demo pair (weights/): lossless, not degenerate, and its drafter really drafts.

A broken drafter, tokenizer or cache would still be *lossless* (the target corrects
every wrong guess), so losslessness alone proves little: tau well above 1 on held-out
prompts is what shows that the drafter, the tokenizer and both caches all work. And
tau on repetitive output measures repetition, not drafting, so the target's own
continuations must not be loops: their distinct-4-gram ratio is checked too (as
`bench.py` measures it, with token healing, as `generate.py` prompts are given).
Speed is the benchmark's business, not this test's.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import distinct_ngram_ratio
from dflash.cli import Prompt, encode_for_generation
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import ModelRunner, generate_autoregressive, generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights"
NEW_TOKENS = 128
# Floors under what the shipped pair measured on these 8 prompts (bench.py, CPU), so that
# a regression fails: mean distinct-4-gram ratio 0.32 (the goal of 0.35 is not reached
# yet: weights/README.md), pooled tau 2.96 at block 16.
MIN_DISTINCT_4GRAMS = 0.25
MIN_TAU = 2.5


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
    lines = (WEIGHTS / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [encode_for_generation(Prompt("heldout", text=json.loads(line)["prompt"]), tokenizer)
               for line in lines[:8]]
    return target, drafter, tokenizer, prompts


def test_greedy_dflash_is_lossless_not_degenerate_and_drafts_on_heldout_prompts(pair):
    target, drafter, tokenizer, prompts = pair
    stop_ids = tokenizer.stop_token_ids
    longest = max(len(ids) for ids, _ in prompts)
    runner = ModelRunner(target, drafter, max_length=longest + NEW_TOKENS + drafter.config.block_size)
    accepted, steps, ratios = 0, 0, []
    for ids, choices in prompts:
        options = dict(stop_ids=stop_ids, runner=runner, first_token_choices=choices)
        plain = generate_autoregressive(target, ids, NEW_TOKENS, **options)
        fast = generate_dflash(target, drafter, ids, NEW_TOKENS, **options)
        assert fast.new_ids == plain.new_ids
        accepted, steps = accepted + sum(fast.acceptance_lengths), steps + fast.steps
        ratios.append(distinct_ngram_ratio(plain.new_ids))
    assert sum(ratios) / len(ratios) >= MIN_DISTINCT_4GRAMS  # the target writes text, not loops
    assert accepted / steps > MIN_TAU  # and the drafter predicts it


def test_the_default_command_runs_out_of_the_box():
    result = subprocess.run([sys.executable, "generate.py", "--prompt", "def fibonacci(n):\n", "--max-new-tokens", "48"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the generated code
    assert "tau" in result.stderr and "tokens/s" in result.stderr
