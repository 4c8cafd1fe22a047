"""Plot the tiny target's training curve: train and held-out loss against the step.

The two curves answer different questions. The train loss (averaged over a few
steps, so noisy) says whether optimisation works; the held-out loss, measured on
fixed windows of files the model never saw, says whether it learned Python
rather than memorised the standard library. A gap that keeps growing would mean
over-fitting; on this corpus and budget the two should stay close.

Usage:  python weights/plot_target.py [--log weights/work/target_log.json] [--out weights/tiny-qwen3-training.png]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # write a file; no display needed
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def read_curves(log_path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """(steps, losses) for each curve; entries without a value for a curve are skipped."""
    log = json.loads(log_path.read_text())
    curves = {}
    for key in ("train_loss", "heldout_loss"):
        points = [(e["step"], e[key]) for e in log if e.get(key) is not None]
        curves[key] = ([s for s, _ in points], [v for _, v in points])
    return curves


def plot(curves: dict, out: Path, title: str) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    axes.plot(*curves["train_loss"], label="train (mean of logged steps)", color="tab:blue", alpha=0.6, lw=1)
    axes.plot(*curves["heldout_loss"], label="held-out files", color="tab:orange", marker="o", ms=3, lw=1.5)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("next-token cross-entropy (nats)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--log", type=Path, default=HERE / "work" / "target_log.json")
    parser.add_argument("--out", type=Path, default=HERE / "tiny-qwen3-training.png")
    parser.add_argument("--title", default="tiny Qwen3 trained on the Python standard library")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    curves = read_curves(args.log)
    plot(curves, args.out, args.title)
    steps, heldout = curves["heldout_loss"]
    final = f"{heldout[-1]:.3f} nats at step {steps[-1]} ({heldout[-1] / math.log(2):.2f} bits/token)" if heldout else "none"
    print(f"wrote {args.out}; final held-out loss: {final}")


if __name__ == "__main__":
    main()
