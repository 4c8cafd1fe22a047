"""The shipped demo pair (weights/): it solves word problems, DFlash changes no token, and the drafter drafts.

A broken drafter, tokenizer or cache would still be *lossless* (the target corrects
every wrong guess), so losslessness alone proves little: tau well above 1 on held-out
problems is what shows that the drafter, the tokenizer and both caches all work. The
answers are checked too (the last number of each reply against the known result), so
"lossless" also shows as "the same accuracy", and the replies must not be loops:
tau on repetitive output measures repetition, not drafting.
Speed is the benchmark's business, not this test's.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash.measure import distinct_ngram_ratio, final_number
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import ModelRunner, generate_autoregressive, generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights"
PROBLEMS = 8  # the first held-out problems of weights/heldout_problems.jsonl
NEW_TOKENS = 96
# Floors under what the shipped pair measured on these 8 problems (CPU, greedy, block 16),
# so that a regression fails: 8/8 correct, pooled tau 6.36, mean distinct-4-gram ratio 0.95.
MIN_CORRECT = 7
MIN_TAU = 5.5
MIN_DISTINCT_4GRAMS = 0.8


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
    problems = [json.loads(line) for line in (WEIGHTS / "heldout_problems.jsonl").read_text().splitlines()]
    return target, drafter, tokenizer, problems[:PROBLEMS]


def test_greedy_dflash_is_lossless_correct_and_drafts_on_heldout_problems(pair):
    target, drafter, tokenizer, problems = pair
    prompts = [tokenizer.encode_chat(problem["messages"]) for problem in problems]  # as generate.py renders them
    runner = ModelRunner(target, drafter, max_length=max(map(len, prompts)) + NEW_TOKENS + drafter.config.block_size)
    accepted = steps = correct = 0
    ratios = []
    for ids, problem in zip(prompts, problems):
        options = dict(stop_ids=tokenizer.stop_token_ids, runner=runner)
        plain = generate_autoregressive(target, ids, NEW_TOKENS, **options)
        fast = generate_dflash(target, drafter, ids, NEW_TOKENS, **options)
        assert fast.new_ids == plain.new_ids
        assert plain.new_ids[-1] == tokenizer.token_to_id("<|im_end|>")  # the reply ends its turn, as a chat model's
        correct += final_number(tokenizer.decode(plain.new_ids, skip_special_tokens=True)) == str(problem["answer"])
        accepted, steps = accepted + sum(fast.acceptance_lengths), steps + fast.steps
        ratios.append(distinct_ngram_ratio(plain.new_ids))
    assert correct >= MIN_CORRECT  # the target solves the problems
    assert sum(ratios) / len(ratios) >= MIN_DISTINCT_4GRAMS  # it writes reasoning, not loops
    assert accepted / steps >= MIN_TAU  # and the drafter predicts it


def test_the_default_command_answers_a_word_problem():
    question = "Mia has 14 apples. She buys 9 more. How many apples are there now?"
    result = subprocess.run([sys.executable, "generate.py", "--prompt", question], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "The answer is 23." in result.stdout
    assert "tau" in result.stderr and "tokens/s" in result.stderr
