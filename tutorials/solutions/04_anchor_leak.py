"""Notebook 4, exercise 1: let a training block see past its anchor, and measure what it does.

Three of notebook 4's short runs (section 6), alike but for the attention pattern: block j
sees the context c < a_j (train.py), c < a_j + 1 (its anchor's own position too: <= instead
of <), and c < a_j + B (the target's features at every position it must guess). Run from
tutorials/: python solutions/04_anchor_leak.py
"""

import contextlib
import functools
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
from dflash.train_kernels import AnchoredBlocks
from generate import generate_dflash
from _demo_pair import notebook4_data, tokenizer

WEIGHTS, BLOCK = ROOT / "weights", 8


def leaky_pattern(anchors, context_length, block_size, extra):
    """AnchoredBlocks, but block j also sees the context positions a_j .. a_j + extra - 1.

    AnchoredBlocks lets block j see c < a_j and nothing else depends on the anchors' values
    (its own block is found by index), so anchors moved right by `extra` give c < a_j + extra.
    Every anchor leaves at least one position after it, so a_j + 1 <= S; the clamp keeps
    larger shifts inside the context.
    """
    return AnchoredBlocks((anchors + extra).clamp(max=context_length), context_length, block_size)


# The check of the notebook's stub: extra=1 adds exactly each block's anchor.
toy = torch.tensor([[3, 8]])  # (batch=1, K=2): blocks of 4 in 12 positions
added = leaky_pattern(toy, 12, 4, extra=1).dense_mask() & ~AnchoredBlocks(toy, 12, 4).dense_mask()  # (1, 1, 8, 20)
assert added[0, 0, :4].nonzero()[:, 1].unique().tolist() == [3]
assert added[0, 0, 4:].nonzero()[:, 1].unique().tolist() == [8]

# Notebook 4's data: the target's answers to 64 questions from the training side of the split.
torch.manual_seed(0)
target = train.freeze(Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3"))
data, heldout = notebook4_data()
work = data.parent  # each run writes its folder beside the data


def short_run(name, pattern=None):
    """Notebook 4's run (section 6) with `pattern` in place of AnchoredBlocks: (last log line, real tau)."""
    out = work / name
    standard = train.AnchoredBlocks
    train.AnchoredBlocks = pattern or standard  # drafter_loss builds its pattern through this name
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            assert train.main(["--target", str(WEIGHTS / "tiny-qwen3"), "--data", str(data), "--out", str(out),
                               "--device", "cpu", "--drafter-layers", "1", "--block-size", str(BLOCK),
                               "--num-anchors", "16", "--batch-size", "8", "--lr", "3e-3", "--steps", "120",
                               "--log-every", "5", "--seed", "0"]) == 0
    finally:
        train.AnchoredBlocks = standard
    drafter, lengths = Drafter.from_pretrained(out, target=target), []
    for prompt_ids, choices in heldout:  # at inference the context stops before the anchor, whatever training saw
        lengths += generate_dflash(target, drafter, prompt_ids, 64, block_size=BLOCK,
                                   stop_ids=tokenizer.stop_token_ids, first_token_choices=choices).acceptance_lengths
    return json.loads((out / "train_log.jsonl").read_text().splitlines()[-1]), sum(lengths) / len(lengths)


runs = {"c < a (train.py)": short_run("strict"),
        "c < a + 1 (<=)": short_run("leak1", functools.partial(leaky_pattern, extra=1)),
        f"c < a + {BLOCK}": short_run("leak_block", functools.partial(leaky_pattern, extra=BLOCK))}
for name, (line, tau) in runs.items():
    accuracy = line["slot_accuracy"]
    print(f"{name:18} training accuracy per slot {accuracy} (mean {sum(accuracy) / len(accuracy):.3f}), "
          f"estimate {line['tau_estimate']:.2f}, real tau {tau:.2f}")

mean = {name: sum(line["slot_accuracy"]) / len(line["slot_accuracy"]) for name, (line, _) in runs.items()}
tau = {name: value for name, (_, value) in runs.items()}
strict, at_anchor, whole = runs
# Seeing the whole block: late slots read the features of the very tokens they guess. Training accuracy rises
# a lot, and the real tau collapses, because at inference those features do not exist.
assert mean[whole] > mean[strict] + 0.03 and tau[whole] < tau[strict] - 0.2
# Seeing the anchor's own position: the target's feature there is its first take on x_(a+1). In a run this
# short, training accuracy moves a little, and none of it reaches the real tau.
assert tau[at_anchor] < tau[strict] + 0.05
print(f"the whole-block leak: training accuracy {mean[strict]:.3f} -> {mean[whole]:.3f}, "
      f"real tau {tau[strict]:.2f} -> {tau[whole]:.2f}; the anchor's position alone: training accuracy "
      f"{mean[strict]:.3f} -> {mean[at_anchor]:.3f}, real tau {tau[strict]:.2f} -> {tau[at_anchor]:.2f}")
print("exercise 1: solved")
