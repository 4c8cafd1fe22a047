"""Every tutorial notebook runs top to bottom without an error (one test per notebook).

Each is executed on a fresh kernel with `tutorials/` as its working directory, as
`tutorials/execute.py` does, but in memory: the committed file and its outputs are
not rewritten.
"""

import importlib.util
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


SOLUTIONS = sorted((TUTORIALS / "solutions").glob("[0-9][0-9]_*.py"))  # _demo_pair.py is their shared setup


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[path.stem for path in SOLUTIONS])
def test_exercise_solution_runs_and_passes_its_checks(solution):
    """Each solution script checks itself (asserts); it runs from tutorials/, as the notebooks do."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(solution)], cwd=TUTORIALS, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
