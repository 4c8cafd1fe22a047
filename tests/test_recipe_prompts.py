"""recipes/tiny/make_prompts.py: the openings it picks, and what `--package-count` adds.

The demo drafter's data comes from these prompts, so the split must hold: training
prompts never from held-out files, the stdlib's first, and adding package prompts
must not change the stdlib's or the held-out ones (the shipped prompt set).
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "recipes" / "tiny" / "make_prompts.py"


def make_split(tmp_path: Path) -> Path:
    stdlib = tmp_path / "stdlib"
    stdlib.mkdir(exist_ok=True)
    for name in ("a", "b", "held"):
        (stdlib / f"{name}.py").write_text("".join(f"x = {i}\n\ndef {name}_{i}(y):\n    return y\n" for i in range(5)))
    split = {"stdlib": str(stdlib), "train": ["a.py", "b.py", "site-packages/tqdm/std.py"], "heldout": ["held.py"]}
    path = tmp_path / "split.json"
    path.write_text(json.dumps(split))
    return path


def run(tmp_path: Path, *options: str) -> tuple[list[str], list[str]]:
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    result = subprocess.run([sys.executable, str(SCRIPT), "--split", str(make_split(tmp_path)), "--train-out",
                             str(train), "--heldout-out", str(heldout), "--context-lines", "3", *options],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    read = lambda path: [json.loads(line)["prompt"] for line in path.read_text().splitlines()]  # noqa: E731
    return read(train), read(heldout)


def test_prompts_end_at_a_def_line_and_keep_train_and_heldout_apart(tmp_path):
    train, heldout = run(tmp_path, "--train-count", "100", "--heldout-count", "3")
    assert len(train) == 10 and len(heldout) == 3  # every opening of a.py and b.py; 3 of held.py's
    assert all(p.splitlines()[-1].startswith("def ") and p.endswith(":\n") for p in train + heldout)
    assert all("def held_" not in p for p in train) and all("def held_" in p for p in heldout)


def test_package_prompts_come_after_the_stdlibs_and_change_nothing_else(tmp_path):
    train, heldout = run(tmp_path, "--train-count", "100", "--heldout-count", "3")
    more_train, more_heldout = run(tmp_path, "--train-count", "100", "--heldout-count", "3", "--package-count", "4")
    assert more_heldout == heldout and more_train[:len(train)] == train
    assert len(more_train) == len(train) + 4  # from tqdm's installed std.py, which has many defs
    assert all(p.splitlines()[-1].lstrip().startswith("def ") for p in more_train[len(train):])


def test_a_negative_count_is_one_error_line(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--split", str(make_split(tmp_path)), "--package-count", "-1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "--package-count" in result.stderr
