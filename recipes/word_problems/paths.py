"""Where the word-problem recipe reads and writes, in one place for all its steps.

What is shipped goes to `weights/` (the two checkpoints, the held-out prompts, the
plots); everything else (corpus text, token arrays, training prompts, generated
data, the target's resume state and log) goes to the scratch folder
`recipes/word_problems/work/`, which git ignores.

The steps import `dflash` and each other as installed packages (`pip install -e .`
lists `recipes.word_problems` beside `dflash`), so they run from any folder.
"""

from __future__ import annotations

from pathlib import Path

from dflash.cli import UsageError

ROOT = Path(__file__).resolve().parents[2]  # the repository root
WEIGHTS = ROOT / "weights"  # what is shipped
WORK = Path(__file__).resolve().parent / "work"  # scratch, git-ignored
CORPUS = WORK / "corpus"


def require(path: Path, made_by: str) -> Path:
    """`path`, or one `error:` line naming the step that makes it (for `run_cli`)."""
    if not path.exists():
        raise UsageError(f"{path}: not found (run {made_by} first)")
    return path
