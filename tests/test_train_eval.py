"""The evaluation train.py logs (dflash/evaluation.py): tau and per-slot acceptance read off the
target's greedy continuation, against the greedy DFlash loop itself. The two compute the target's
features differently (one full pass, chunked verify passes), so they could part on a near-tie;
on these prompts they agree step for step."""

from pathlib import Path

import pytest
import torch

from dflash.data import encode_prompts
from dflash.drafter import Drafter
from dflash.evaluation import (acceptance_lengths, evaluate, greedy_continuations,
                               served_figures)
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer, stop_token_ids
from generate import generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS, FIXTURES = ROOT / "weights", ROOT / "tests" / "fixtures"


def demo_prompts(count: int):
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
    prompts = encode_prompts(WEIGHTS / "heldout_problems.jsonl", tokenizer, chat=None,
                             thinking=False, token_healing=True,
                             vocab_size=target.config.vocab_size)[:count]
    return target, drafter, prompts, stop_token_ids(WEIGHTS / "tiny-qwen3", tokenizer)


@pytest.mark.parametrize("pair", ["demo, stopping at its stop tokens", "fixture, cut at the limit"])
def test_the_replayed_loop_commits_what_the_greedy_dflash_loop_commits(pair):
    if pair.startswith("demo"):
        target, drafter, prompts, stop_ids = demo_prompts(12)
    else:  # random prompts, no stop token: every answer runs to max_new_tokens
        target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
        drafter = Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)
        generator = torch.Generator().manual_seed(0)
        prompts = [(torch.randint(0, 500, (5 + i,), generator=generator).tolist(), None)
                   for i in range(6)]
        stop_ids = ()
    continuations = greedy_continuations(target, prompts, 48, stop_ids, drafter.config.block_size)
    steps = 0
    for (ids, choices), continuation in zip(prompts, continuations, strict=True):
        loop = generate_dflash(target, drafter, ids, 48, stop_ids=stop_ids,
                               first_token_choices=choices)
        answer = continuation.ids[continuation.prompt_length:][:continuation.answer_length]
        assert answer == loop.new_ids
        assert acceptance_lengths(target, drafter, continuation) == loop.acceptance_lengths
        steps += loop.steps
    assert steps > len(prompts)  # the loops took several steps each


def test_served_figures_by_hand():
    """Steps of 1, 1, 2 and 3 tokens (blocks of 3): tau 7/4; slot 1 reached 4 times, kept twice;
    slot 2 reached twice (steps of 2 and 3), kept once."""
    assert served_figures([2, 1, 1]) == {"eval_tau": 1.75, "eval_slot_acceptance": [0.5, 0.5]}
    assert served_figures([0, 0, 0]) == {"eval_tau": None, "eval_slot_acceptance": [None, None]}


def test_evaluate_pools_the_steps_of_every_prompt():
    target, drafter, prompts, stop_ids = demo_prompts(4)
    continuations = greedy_continuations(target, prompts, 32, stop_ids, drafter.config.block_size)
    lengths = [n for c in continuations for n in acceptance_lengths(target, drafter, c)]
    figures = evaluate(target, drafter.config, drafter.state_dict(), continuations)
    assert figures["eval_tau"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-4)
    assert len(figures["eval_slot_acceptance"]) == drafter.config.block_size - 1
