"""Run the tutorial notebooks top to bottom and save their outputs into them.

The notebooks are committed with their outputs, so that their plots show on the
repository page. After editing one, run it again here:

    python tutorials/execute.py                                   # all of them, in order
    python tutorials/execute.py tutorials/03_the_dflash_drafter.ipynb

Each notebook runs on a fresh Python kernel ("python3", this interpreter's) with
`tutorials/` as its working directory, as when Jupyter opens it. A cell that raises
stops the run, and that notebook's file is left as it was. `tests/test_tutorials.py`
calls `run_notebook` too, without saving.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # tutorials/: every notebook's working directory


def run_notebook(path: Path, timeout: int = 600):
    """Execute the notebook at `path` in memory and return it with its outputs; raise on any error.

    `timeout` is per cell, in seconds. Cells get no timing metadata, so running a
    notebook again changes its file only where its outputs change.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute the tutorial notebooks in place, saving their outputs.")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: tutorials/*.ipynb, in order)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    args = parser.parse_args(argv)
    import nbformat
    from nbclient.exceptions import CellExecutionError

    paths = args.notebooks or sorted(HERE.glob("*.ipynb"))
    failed = 0
    for path in paths:
        began = time.perf_counter()
        try:
            notebook = run_notebook(path, args.timeout)
        except CellExecutionError as error:
            print(f"{path.name}: FAILED after {time.perf_counter() - began:.1f} s, file left as it was\n{error}",
                  file=sys.stderr)
            failed += 1
            continue
        nbformat.write(notebook, path)
        print(f"{path.name}: {time.perf_counter() - began:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
