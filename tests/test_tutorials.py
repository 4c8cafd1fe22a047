"""Every tutorial notebook runs top to bottom without an error (one test per notebook).

Each is executed on a fresh kernel with `tutorials/` as its working directory, as
`tutorials/execute.py` does, but in memory: the committed file and its outputs are
not rewritten.
"""

import importlib.util
import json
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


# The student copy: tests/test_student_copy.py.


# ------------------------------------------------------------------ one source for the labs' times


def lab_table() -> dict[str, tuple[int, int]]:
    """{lab: (minutes, points)} from labs/README.md's table, the one place a lab's time is
    stated."""
    rows = re.findall(
        r"^\| (\d\d_[a-z_]+) \|.*\| (\d+) min \| (\d+) \|", (LABS / "README.md").read_text(), re.M
    )
    return {lab: (int(minutes), int(points)) for lab, minutes, points in rows}


def test_each_labs_time_and_points_are_stated_once():
    table = lab_table()
    assert set(table) == {lab.name for lab in LAB_FOLDERS}, (
        "labs/README.md's table lists every lab, once"
    )
    readme = (LABS / "README.md").read_text()
    warm_ups = set(re.findall(r"^\| (\d\d_[a-z_]+) \|[^\n]*\(a warm-up\)", readme, re.M))
    for lab in LAB_FOLDERS:
        starter = (lab / "starter.py").read_text()
        assert "minute" not in starter, f"{lab.name}'s starter states a time"
        assert ("a warm-up" in starter.split("\n\n")[0]) == (lab.name in warm_ups), \
            f"{lab.name}: its starter and the table disagree on whether it is a warm-up"
    for notebook in NOTEBOOKS:
        text = notebook.read_text()
        assert not re.search(r"\(\d+ minutes\)", text), f"{notebook.name} states an exercise's time"
    syllabus = (TUTORIALS / "SYLLABUS.md").read_text()
    assert not re.search(r"`[a-z_]+` \(\d+|minutes of labs", syllabus), (
        "SYLLABUS.md states a lab's time"
    )
    assert "labs/README.md" in syllabus, "SYLLABUS.md points to the table of times"


# ------------------------------------------------------------------ a key that cannot go stale

KEY = TUTORIALS / "INSTRUCTOR_KEY.md"
NUMBER = re.compile(r"(?<![\w.§])[−-]?\d[\d,]*(?:\.\d+)?")
# Numbers the key works out rather than reads off its notebook: (notebook, as the key writes it, the
# value).
DERIVED = [
    ("1", "147,456", 2 * 36 * 8 * 128 * 2),  # KV bytes per token of Qwen3-8B
    ("2", "0.26", 16 * 16e9 / 989e12 * 1e3),  # ms of arithmetic for 16 tokens on the H100
    ("2", "512", 512),  # the outcomes of notebook 2's sampler (its vocabulary)
    (
        "2",
        "0.09",
        (511 / 2000) ** 0.5 / 2 * 0.7,
    ),  # the noise of 2000 draws over 512 outcomes, about
    ("6", "15", 16 - 1),  # drafts proposed at block 16
    ("6", "7.0", 8 - 1),  # tau - 1
    ("6", "65,536", 2**16),
    ("7", "295", 989 / 3.35),  # the H100's ridge
    ("8", "4.16", (1 - 0.8**8) / 0.2),
    ("8", "8.15", (1 - 0.9**16) / 0.1),
    ("8", "206", 989 / 4.8),  # the H200's ridge
    ("8", "0.48", 3.63 - 3.15),  # the prefill's share of the block-16 prediction, from the printed table
    ("8", "295", 989 / 3.35),
]


def as_number(text: str) -> float:
    return float(text.replace("−", "-").replace(",", "").lstrip("-"))


def agrees(quoted: str, value: float) -> bool:
    """`quoted` (as the key writes it) is `value` to the digits quoted."""
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(round(abs(value), digits) - as_number(quoted)) < 10**-digits / 2 + 1e-9


def notebook_numbers(number: str) -> tuple[list[float], list[float]]:
    """(numbers in notebook `number`'s sources, numbers in its saved outputs)."""
    notebook = json.loads(next(TUTORIALS.glob(f"0{number}_*.ipynb")).read_text())
    sources, outputs = [], []
    for cell in notebook["cells"]:
        sources += [as_number(m) for m in NUMBER.findall("".join(cell["source"]))]
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) + "".join(
                output.get("data", {}).get("text/plain", "")
            )
            outputs += [as_number(m) for m in NUMBER.findall(text)]
    return sources, outputs


def test_every_number_in_the_instructors_key_is_the_executed_notebooks():
    """Each number the key quotes for notebook N is one its saved outputs print (to the digits
    quoted), one its text states, or one the key works out (DERIVED, checked here); a number in a
    sentence about "the committed run" must be one the outputs print (the range "a busy machine"
    prints is the exception). So a re-executed notebook that prints other figures fails this test
    until the key is brought up to date."""
    sections = re.split(r"^## (\d) · .*$", KEY.read_text(), flags=re.M)
    stale = []
    for number, body in zip(sections[1::2], sections[2::2]):
        sources, outputs = notebook_numbers(number)
        derived = [(quoted, value) for where, quoted, value in DERIVED if where == number]
        for sentence in re.split(r"(?<=[.:;])\s+", body.replace("\n", " ")):
            run = "committed run" in sentence
            if "busy machine" in sentence:
                sentence = sentence.split("busy machine")[
                    0
                ]  # what follows is the range timings vary in
            for quoted in NUMBER.findall(sentence):
                quoted = quoted.rstrip(",")
                seen = outputs if run else outputs + sources
                if not any(agrees(quoted, value) for value in seen) and not any(
                    q == quoted.lstrip("−-") and agrees(q, v) for q, v in derived
                ):
                    stale.append(f"notebook {number}: {quoted} in {sentence[:90]!r}")
    assert not stale, (
        "numbers the key quotes that the executed notebooks do not give:\n" + "\n".join(stale)
    )


def test_the_syllabus_maps_every_objective_to_what_assesses_it_and_totals_its_points():
    """Each notebook's objectives (`N. ...` under its heading) have a row in the objectives table,
    whose questions exist in the key and whose labs exist; the rubric's totals are the table's."""
    syllabus = (TUTORIALS / "SYLLABUS.md").read_text()
    notebooks = re.split(
        r"^### (\d) · ", syllabus.split("## The notebooks", 1)[1].split("\n## ", 1)[0], flags=re.M
    )
    objectives = {
        f"{number}.{item}"
        for number, body in zip(notebooks[1::2], notebooks[2::2])
        for item in re.findall(r"^(\d)\. ", body, re.M)
    }
    table = syllabus.split("## What assesses each objective", 1)[1]
    rows = dict(re.findall(r"^\| (\d\.\d) [^|]*\| ([^|]*) \|$", table, re.M))
    assert objectives and set(rows) == objectives, sorted(objectives ^ set(rows))
    key = KEY.read_text()
    asked = {
        f"{number}.{item}"
        for number, body in re.findall(r"^## (\d) · .*?\n(.*?)(?=^## |\Z)", key, re.M | re.S)
        for item in re.findall(r"^(\d)\. \*\*", body, re.M)
    }
    for objective, assessed in rows.items():
        assert set(re.findall(r"Q (\d\.\d)", assessed)) <= asked, (
            f"{objective}: a question the key lacks"
        )
        assert {f"{lab}" for lab in re.findall(r"`(\d\d_[a-z_]+)`", assessed)} <= {
            lab.name for lab in LAB_FOLDERS
        }
    optional = set(re.findall(r"`(\d\d_[a-z_]+)` \(optional\)", syllabus))
    points = {lab: value for lab, (_, value) in lab_table().items()}
    total, required = (
        sum(points.values()),
        sum(value for lab, value in points.items() if lab not in optional),
    )
    assert f"{total} in all, {required} without the optional ones" in syllabus
