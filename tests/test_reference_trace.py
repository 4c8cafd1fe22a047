"""Greedy DFlash equals the DFlash authors' own loop on the demo pair, where drafts are accepted.

`tests/fixtures/demo-reference-trace/trace.json` holds what the authors' `dflash_generate`
produced on `weights/` (CPU, float32, greedy; see its REFERENCE.md and `make_trace.py`):
most steps there accept several drafts, so the drafter's context is committed several
positions at a time, which the random-weight fixture `dflash-tiny` (every step accepts
nothing) never compares with their code.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer
from generate import generate_dflash

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(__file__).parent / "fixtures" / "demo-reference-trace"
TRACE = json.loads((FOLDER / "trace.json").read_text())
CONDITIONS = TRACE["conditions"]


def our_steps(their_lengths: list[int], max_new_tokens: int) -> list[int]:
    """The steps our loop runs, given the acceptance lengths the authors' loop reports.

    Both count a step as its accepted drafts + 1 (the tokens it makes, the target's
    bonus token included) and stop after the step that makes a stop token. Their loop
    runs while the bonus token's position is below prompt + `max_new_tokens`
    (`while start < max_length`): a step that ends with exactly `max_new_tokens` out is
    followed by one more verification, whose tokens are cut off. Ours stops there.
    """
    made = 1  # the prefill's token
    for step, length in enumerate(their_lengths, start=1):
        made += length
        if made >= max_new_tokens:
            return their_lengths[:step]
    return their_lengths


@pytest.fixture(scope="module")
def demo_pair():
    for name in ("target", "drafter"):
        weights = ROOT / CONDITIONS[name] / "model.safetensors"
        assert hashlib.sha256(weights.read_bytes()).hexdigest() == CONDITIONS[f"{name}_sha256"], (
            f"{weights} is not the checkpoint the trace was made with: remake it with {FOLDER / 'make_trace.py'}")
    torch.set_num_threads(1)
    target = Qwen3.from_pretrained(ROOT / CONDITIONS["target"], dtype=torch.float32)
    return target, Drafter.from_pretrained(ROOT / CONDITIONS["drafter"], target=target, dtype=torch.float32)


def test_the_trace_accepts_drafts():
    lengths = [n for case in TRACE["cases"] for n in case["acceptance_lengths"]]
    assert sum(lengths) / len(lengths) > 4 and sum(n > 1 for n in lengths) > len(lengths) / 2
    assert any(our_steps(c["acceptance_lengths"], c["max_new_tokens"]) != c["acceptance_lengths"]
               for c in TRACE["cases"])  # one case takes the extra step at the limit


@pytest.mark.parametrize("case", TRACE["cases"],
                         ids=[f"{c['source'].split(':')[-1]}-block{c['block_size']}-new{c['max_new_tokens']}"
                              for c in TRACE["cases"]])
def test_greedy_dflash_matches_the_authors_loop(demo_pair, case):
    target, drafter = demo_pair
    result = generate_dflash(target, drafter, case["prompt_ids"], case["max_new_tokens"],
                             block_size=case["block_size"], stop_ids=CONDITIONS["stop_token_ids"])
    assert result.new_ids == case["new_ids"]
    assert result.acceptance_lengths == our_steps(case["acceptance_lengths"], case["max_new_tokens"])


def test_the_prompts_are_rendered_as_generate_renders_them():
    tokenizer = find_tokenizer(ROOT / CONDITIONS["target"], required=True)
    for case in TRACE["cases"]:
        file, line = case["source"].rsplit(":", 1)
        prompt = read_prompts(ROOT / file)[int(line) - 1]
        assert prompt.messages[-1]["content"] == case["question"]
        assert encode_for_generation(prompt, tokenizer) == (case["prompt_ids"], None)
