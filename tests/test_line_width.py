"""Lines of at most 100 columns: a reader sees a whole line without scrolling, as in gpt-fast and nanoGPT.
The files listed are those rewrapped so far; each new one joins the list once it fits."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS = 100
CHECKED = ["generate.py", "train.py", "dflash/qwen3.py", "dflash/drafter.py", "dflash/tree.py",
           "dflash/measure.py", "dflash/compiled.py", "dflash/generate_options.py", "dflash/data.py",
           "dflash/evaluation.py", "dflash/train_config.py", "dflash/block_choice.py",
           "benchmarks/block_sweep.py", "benchmarks/verify_what_pays.py",
           "benchmarks/busy_neighbour.py", "benchmarks/engine_fields.py",
           "benchmarks/sweep_common.py"]


def wide_lines(path: Path) -> list[str]:
    """`file:line (columns)` for every line of `path` wider than MAX_COLUMNS."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(ROOT)}:{number} ({len(line)})"
            for number, line in enumerate(lines, start=1) if len(line) > MAX_COLUMNS]


@pytest.mark.parametrize("name", CHECKED)
def test_no_line_is_wider_than_100_columns(name):
    assert wide_lines(ROOT / name) == []


def test_the_check_catches_a_wide_line(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    wide = tmp_path / "wide.py"
    wide.write_text("x = 1\n" + "y = '" + "a" * 100 + "'\n")
    assert wide_lines(wide) == ["wide.py:2 (106)"]
