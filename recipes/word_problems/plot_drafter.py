"""Plot a drafter's training curve from train.py's log: loss, and the tau estimate.

    python recipes/word_problems/plot_drafter.py --log weights/tiny-qwen3-dflash/train_log.jsonl

The loss is the decayed-weight cross-entropy over block slots; the tau estimate is
1 + sum_k prod_{i<=k} acc_i from the per-slot accuracies (see train.estimated_tau):
it says how many tokens a verification would commit if the slots were independent.
Real tau, measured by speculative decoding, is marked where the log has it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib.pyplot as plt

from dflash.cli import OneLineErrors, run_cli
from recipes.word_problems.paths import WEIGHTS, require


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, default=WEIGHTS / "tiny-qwen3-dflash" / "train_log.jsonl")
    parser.add_argument("--out", type=Path, default=WEIGHTS.parent / "docs" / "results" / "tiny-qwen3-dflash-training.png")
    return parser


def main(args: argparse.Namespace) -> int:
    plt.switch_backend("Agg")  # write a file; no display needed
    log = require(args.log, "train.py")
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    trained = [e for e in entries if "loss" in e and e["step"] > 10]  # the first log line is the init's spike
    figure, (loss_axes, tau_axes) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    loss_axes.plot([e["step"] for e in trained], [e["loss"] for e in trained], color="tab:blue")
    loss_axes.set(xlabel="step", ylabel="weighted cross-entropy (nats)", title="drafter loss")
    tau_axes.plot([e["step"] for e in trained], [e["tau_estimate"] for e in trained], color="tab:green",
                  label="estimate from slot accuracies")
    evaluated = [e for e in entries if e.get("eval_tau") is not None]
    if evaluated:
        tau_axes.plot([e["step"] for e in evaluated], [e["eval_tau"] for e in evaluated], "o", color="tab:red",
                      label="real speculative decoding, held-out prompts")
    tau_axes.set(xlabel="step", ylabel="tokens per target pass", title="tau")
    tau_axes.legend()
    for axes in (loss_axes, tau_axes):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
