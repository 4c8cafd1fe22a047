"""Code openings to prompt the demo target with (after train_target.py).

    python recipes/tiny/make_prompts.py --seed 0

Two JSONL files of `{"prompt": ...}` records, each prompt a piece of real code
that stops right after a `def` line, where the model has a function body to write:
- `recipes/tiny/work/train_prompts.jsonl` (scratch) from the *training* files: the
  target's own continuations of these become the drafter's training data (the
  stdlib's, then `--package-count` more from the extra packages' files);
- `weights/heldout_prompts.jsonl` from the *held-out* files (shipped): the default
  prompt set of `python bench.py` for the demo pair, never seen in training.

Then: `python make_data.py` (the target's continuations), see `recipes/tiny/README.md`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from build_corpus import package_folder
from paths import CORPUS, WEIGHTS, WORK, require  # also puts the repository root on sys.path, for dflash
from dflash.cli import OneLineErrors, UsageError, run_cli


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


def package_train_files(split: dict) -> list[Path]:
    """The extra packages' training files (keyed `site-packages/NAME/...` in the split), where they are installed."""
    prefix = "site-packages/"
    names = [f[len(prefix):].split("/", 1) for f in split["train"] if f.startswith(prefix)]
    return [package_folder(name) / relative for name, relative in names]


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
    parser.add_argument("--package-count", type=int, default=0,
                        help="also this many training prompts from the extra packages' training files, "
                             "after the stdlib's (when the stdlib has too few openings)")
    parser.add_argument("--heldout-count", type=int, default=24)
    parser.add_argument("--context-lines", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(args: argparse.Namespace) -> int:
    for name in ("train_count", "package_count", "heldout_count", "context_lines"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}")
    split = json.loads(require(args.split, "recipes/tiny/build_corpus.py").read_text())
    root, rng = Path(split["stdlib"]), random.Random(args.seed)
    # Prompts come from the stdlib's files first: the held-out prompts do, and the drafter
    # should learn on the kind of text it is measured on. The stdlib has about 14,000
    # openings; `--package-count` adds more from the extra packages' training files.
    stdlib_train = [root / f for f in split["train"] if not f.startswith("site-packages/")]
    train_prompts = sample_prompts(stdlib_train, args.train_count, args.context_lines, rng)
    heldout_prompts = sample_prompts([root / f for f in split["heldout"]], args.heldout_count, args.context_lines, rng)
    if args.package_count:  # from their own generator, so that the stdlib's prompts stay as they were
        train_prompts += sample_prompts(package_train_files(split), args.package_count, args.context_lines,
                                        random.Random(args.seed + 1))
    write_jsonl(args.train_out, train_prompts)
    write_jsonl(args.heldout_out, heldout_prompts)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
