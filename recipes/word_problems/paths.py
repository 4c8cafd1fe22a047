"""Where the word-problem recipe reads and writes, in one place for all its steps.

What is shipped goes to `weights/` (the two checkpoints, the held-out prompts, the
plots); everything else (corpus text, token arrays, training prompts, generated
data, the target's resume state and log) goes to the scratch folder
`recipes/word_problems/work/`, which git ignores.

Importing this module also puts the repository root on `sys.path`, so the steps
find the `dflash` package even where it is not installed (`pip install -e .`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root
WEIGHTS = ROOT / "weights"  # what is shipped
WORK = Path(__file__).resolve().parent / "work"  # scratch, git-ignored
CORPUS = WORK / "corpus"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dflash.cli import UsageError  # noqa: E402


def require(path: Path, made_by: str) -> Path:
    """`path`, or one `error:` line naming the step that makes it (for `run_cli`)."""
    if not path.exists():
        raise UsageError(f"{path}: not found (run {made_by} first)")
    return path
