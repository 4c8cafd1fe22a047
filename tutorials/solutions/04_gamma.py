"""Notebook 4, exercise 2: the decay-weighted loss against no decay.

Notebook 4's short run (section 6) twice, with the paper's gamma = 4 for blocks of 8 and
with no decay (gamma so large that every labelled slot weighs 1). Run from tutorials/:
python solutions/04_gamma.py
"""

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path.cwd().parent  # run from tutorials/, as the notebooks are
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "recipes" / "word_problems"))

import torch

import train
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from generate import generate_dflash
from _demo_pair import notebook4_data, tokenizer

WEIGHTS, BLOCK = ROOT / "weights", 8

# Notebook 4's data: the target's answers to 64 questions from the training side of the split.
torch.manual_seed(0)
target = train.freeze(Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3"))
data, heldout = notebook4_data()
work = data.parent  # each run writes its folder beside the data


def short_run(name, *options):
    """Notebook 4's run (section 6) with extra train.py options: (last log line, real tau on the held-out prompts)."""
    out = work / name
    with contextlib.redirect_stderr(io.StringIO()):
        assert train.main(["--target", str(WEIGHTS / "tiny-qwen3"), "--data", str(data), "--out", str(out),
                           "--device", "cpu", "--drafter-layers", "1", "--block-size", str(BLOCK),
                           "--num-anchors", "16", "--batch-size", "8", "--lr", "3e-3", "--steps", "120",
                           "--log-every", "5", "--seed", "0", *options]) == 0
    drafter, lengths = Drafter.from_pretrained(out, target=target), []
    for prompt_ids, choices in heldout:
        lengths += generate_dflash(target, drafter, prompt_ids, 64, block_size=BLOCK,
                                   stop_ids=tokenizer.stop_token_ids, first_token_choices=choices).acceptance_lengths
    return json.loads((out / "train_log.jsonl").read_text().splitlines()[-1]), sum(lengths) / len(lengths)


def compare_decay():
    """{"decay": (last log line, tau), "none": (last log line, tau)}: gamma 4 and no decay."""
    no_decay = 1e9  # exp(-(k-1)/1e9) is 1 to nine digits for every slot
    assert torch.allclose(train.slot_weights(BLOCK, no_decay)[1:], torch.ones(BLOCK - 1))
    return {"decay": short_run("gamma4", "--gamma", str(train.gamma_for_block_size(BLOCK))),
            "none": short_run("no_decay", "--gamma", str(no_decay))}


result = compare_decay()
(with_decay, tau_decay), (without, tau_none) = result["decay"], result["none"]
for name, line, tau in [("gamma 4", with_decay, tau_decay), ("no decay", without, tau_none)]:
    print(f"{name:>9}: training accuracy per slot {line['slot_accuracy']}, real tau {tau:.2f}")
# The decay spends the model's capacity where acceptance needs it: slot 1 gains, the last slot loses ...
assert with_decay["slot_accuracy"][0] > without["slot_accuracy"][0] + 0.03
assert without["slot_accuracy"][-1] > with_decay["slot_accuracy"][-1]
# ... and since a draft is only kept up to its first miss, the real tau is higher with the decay.
assert tau_decay > tau_none
print(f"slot 1: {without['slot_accuracy'][0]:.2f} without decay, {with_decay['slot_accuracy'][0]:.2f} with; "
      f"slot {BLOCK - 1}: {without['slot_accuracy'][-1]:.2f} without, {with_decay['slot_accuracy'][-1]:.2f} with; "
      f"real tau {tau_none:.2f} without, {tau_decay:.2f} with")
print("exercise 2: solved")
