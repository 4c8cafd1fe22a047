"""Every tutorial notebook runs top to bottom without an error (one test per notebook).

Each is executed on a fresh kernel with `tutorials/` as its working directory, as
`tutorials/execute.py` does, but in memory: the committed file and its outputs are
not rewritten.
"""

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("nbclient", reason="the notebook tests need the test extras: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="the notebook tests need the test extras: pip install -e '.[test]'")

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))


def load_execute():
    """tutorials/execute.py, which is a script and not a package module."""
    spec = importlib.util.spec_from_file_location("tutorials_execute", TUTORIALS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebooks_are_found():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_without_error(notebook):
    executed = load_execute().run_notebook(notebook, timeout=600)  # raises CellExecutionError on any error
    assert any(cell.get("outputs") for cell in executed.cells if cell.cell_type == "code")


LABS = TUTORIALS / "labs"
LAB_FOLDERS = sorted(path for path in LABS.iterdir() if path.is_dir() and path.name[:2].isdigit())


def test_every_lab_fails_on_its_committed_starter_saying_which_file_to_edit():
    """A student's first `python -m pytest tutorials/labs`: every lab fails, each with one line naming its own
    starter file. (CI grades the reference solutions with DFLASH_LABS=solutions; an unsolved starter fails on
    its first call, before any model loads, so this costs seconds.)"""
    import os
    import subprocess
    import sys

    assert len(LAB_FOLDERS) >= 24
    environment = {name: value for name, value in os.environ.items() if name != "DFLASH_LABS"}  # the starters
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(LABS)],
                          cwd=TUTORIALS.parent, env=environment, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    # Each lab's message, once (pytest repeats it in its summary, cut to the terminal's width, or whole under CI).
    said = dict(re.findall(r"(\d\d_[a-z_]+): \S+ is not written yet - edit tutorials/labs/(\d\d_[a-z_]+)/starter\.py",
                           output))
    assert done.returncode == 1 and f"{len(LAB_FOLDERS)} failed in" in output and "passed" not in output, output[-3000:]
    assert said == {lab.name: lab.name for lab in LAB_FOLDERS}, output[-3000:]
