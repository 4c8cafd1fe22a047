"""Code openings to prompt the demo target with (after train_target.py).

    python recipes/tiny/make_prompts.py --seed 0

Two JSONL files of `{"prompt": ...}` records, each prompt a piece of real code
that stops right after a `def` line, where the model has a function body to write:
- `recipes/tiny/work/train_prompts.jsonl` (scratch) from the *training* files: the
  target's own continuations of these become the drafter's training data;
- `weights/heldout_prompts.jsonl` from the *held-out* files (shipped): the default
  prompt set of `python bench.py` for the demo pair, never seen in training.

Then: `python make_data.py` (the target's continuations), see `recipes/tiny/README.md`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from paths import CORPUS, WEIGHTS, WORK, require  # also puts the repository root on sys.path, for dflash
from dflash.cli import OneLineErrors, run_cli


def openings(text: str, context_lines: int) -> list[str]:
    """Every snippet of up to `context_lines` lines that ends with a `def ...:` line."""
    lines = text.splitlines(keepends=True)
    found = []
    for index, line in enumerate(lines):
        if line.lstrip().startswith("def ") and line.rstrip().endswith(":"):
            found.append("".join(lines[max(0, index + 1 - context_lines):index + 1]))
    return found


def sample_prompts(files: list[Path], count: int, context_lines: int, rng: random.Random) -> list[str]:
    candidates = [snippet for f in files for snippet in openings(f.read_text(errors="replace"), context_lines)]
    rng.shuffle(candidates)
    return candidates[:count]


def write_jsonl(path: Path, prompts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    print(f"{path}: {len(prompts)} prompts")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", type=Path, default=CORPUS / "split.json")
    parser.add_argument("--train-out", type=Path, default=WORK / "train_prompts.jsonl")
    parser.add_argument("--heldout-out", type=Path, default=WEIGHTS / "heldout_prompts.jsonl")
    parser.add_argument("--train-count", type=int, default=2000)
    parser.add_argument("--heldout-count", type=int, default=24)
    parser.add_argument("--context-lines", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(args: argparse.Namespace) -> int:
    split = json.loads(require(args.split, "recipes/tiny/build_corpus.py").read_text())
    root, rng = Path(split["stdlib"]), random.Random(args.seed)
    # Prompts come from the stdlib's files only: the held-out prompts do, and the drafter
    # should learn on the kind of text it is measured on (`--extra-packages` only feeds the target).
    stdlib_train = [root / f for f in split["train"] if not f.startswith("site-packages/")]
    write_jsonl(args.train_out, sample_prompts(stdlib_train, args.train_count, args.context_lines, rng))
    write_jsonl(args.heldout_out,
                sample_prompts([root / f for f in split["heldout"]], args.heldout_count, args.context_lines, rng))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
