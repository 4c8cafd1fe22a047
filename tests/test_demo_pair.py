"""The shipped demo pair (weights/): lossless, and its drafter really drafts.

A broken drafter, tokenizer or cache would still be *lossless* (the target corrects
every wrong guess), so losslessness alone proves little: tau above 3 on held-out
prompts is what shows that the drafter, the tokenizer and both caches all work.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import ModelRunner, generate_autoregressive, generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights"
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
    lines = (WEIGHTS / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in lines[:8]]
    return target, drafter, tokenizer, prompts


def test_greedy_dflash_is_lossless_and_drafts_well_on_heldout_prompts(pair):
    target, drafter, tokenizer, prompts = pair
    stop_ids = tokenizer.stop_token_ids
    runner = ModelRunner(target, drafter, max_length=max(map(len, prompts)) + NEW_TOKENS + drafter.config.block_size)
    committed, passes = 0, 0
    for prompt in prompts:
        plain = generate_autoregressive(target, prompt, NEW_TOKENS, stop_ids=stop_ids, runner=runner)
        fast = generate_dflash(target, drafter, prompt, NEW_TOKENS, stop_ids=stop_ids, runner=runner)
        assert fast.new_ids == plain.new_ids
        committed, passes = committed + sum(fast.acceptance_lengths), passes + fast.steps
    assert committed / passes > 3.0


def test_the_default_command_runs_out_of_the_box():
    result = subprocess.run([sys.executable, "generate.py", "--prompt", "def fibonacci(n):", "--max-new-tokens", "48"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the generated code
    assert "tau" in result.stderr and "tokens/s" in result.stderr
