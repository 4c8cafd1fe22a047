"""Plot the tiny target's training curve: train and held-out loss against the step.

The two curves answer different questions. The train loss (averaged over a few
steps, so noisy) says whether optimisation works; the held-out loss, measured on
fixed windows of held-out problems the model never saw, says whether it learned to
solve them rather than memorise its training problems. A gap that keeps growing would mean
over-fitting; on this corpus and budget the two should stay close.

Usage:  python recipes/word_problems/plot_target.py [--log recipes/word_problems/work/target_log.json [PHASE-2 LOG ...]]
                                           [--out docs/results/tiny-qwen3-training.png]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt

from dflash.cli import OneLineErrors, run_cli
from recipes.word_problems.paths import WEIGHTS, WORK, require


def read_curves(log_paths: list[Path]) -> tuple[dict[str, tuple[list[int], list[float]]], list[int]]:
    """(steps, losses) for each curve, the phases' logs one after another; and where each later phase begins.

    A later phase (`train_target.py --init-from`) counts its steps from 1 again:
    they are shifted to follow the previous phase's last step.
    """
    curves = {"train_loss": ([], []), "heldout_loss": ([], [])}
    offset, boundaries = 0, []
    for log_path in log_paths:
        log = json.loads(require(log_path, "recipes/word_problems/train_target.py").read_text())
        for key, (steps, values) in curves.items():
            points = [(offset + e["step"], e[key]) for e in log if e.get(key) is not None]
            steps += [s for s, _ in points]
            values += [v for _, v in points]
        offset += log[-1]["step"]
        boundaries.append(offset)
    return curves, boundaries[:-1]


def plot(curves: dict, boundaries: list[int], out: Path, title: str) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    axes.plot(*curves["train_loss"], label="train (mean of logged steps)", color="tab:blue", alpha=0.6, lw=1)
    axes.plot(*curves["heldout_loss"], label="held-out problems", color="tab:orange", marker="o", ms=3, lw=1.5)
    for index, step in enumerate(boundaries):
        axes.axvline(step, color="grey", ls="--", lw=1, label="next phase begins" if index == 0 else None)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("next-token cross-entropy (nats)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--log", type=Path, nargs="+", default=[WORK / "target_log.json"],
                        help="the run's log; several: the phases of one run, in order")
    parser.add_argument("--out", type=Path, default=WEIGHTS.parent / "docs" / "results" / "tiny-qwen3-training.png")
    parser.add_argument("--title", default="tiny Qwen3 trained on word problems")
    return parser


def main(args: argparse.Namespace) -> int:
    plt.switch_backend("Agg")  # write a file; no display needed
    curves, boundaries = read_curves(args.log)
    plot(curves, boundaries, args.out, args.title)
    steps, heldout = curves["heldout_loss"]
    final = f"{heldout[-1]:.3f} nats at step {steps[-1]} ({heldout[-1] / math.log(2):.2f} bits/token)" if heldout else "none"
    print(f"wrote {args.out}; final held-out loss: {final}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
