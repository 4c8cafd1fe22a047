"""Every tutorial notebook runs top to bottom without an error (one test per notebook), and the
course's documents add up: the labs' table is the one source of times and points, the key quotes
the executed notebooks, every objective is assessed by something graded, the days fit.

Each notebook is executed on a fresh kernel with `tutorials/` as its working directory, as
`tutorials/execute.py` does, but in memory: the committed file and its outputs are
not rewritten. The student copy has its own tests: tests/test_student_copy.py.
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


# ------------------------------------------------------------------ the syllabus adds up

SYLLABUS = TUTORIALS / "SYLLABUS.md"
WORDS = {"Eight": 8, "Nine": 9, "Ten": 10, "Seven": 7}


def lab_named(short: str) -> str:
    """A lab's folder from the name the syllabus's plan uses (`rope` is `01_rope`)."""
    found = [lab.name for lab in LAB_FOLDERS if lab.name[3:] == short]
    assert len(found) == 1, f"the plan names {short!r}, which is no lab"
    return found[0]


def days() -> list[dict]:
    """The plan's rows: day, notebooks (numbers, in order), reading minutes (one per notebook),
    graded and optional labs, stated minutes."""
    plan = SYLLABUS.read_text().split("## The two weeks", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in plan.splitlines()
            if re.match(r"\| \d+ \|", line)]
    return [{"day": int(day),
             "notebooks": [int(part[0]) for part in notebooks.split("; ") if part[0].isdigit()],
             "reading": [int(value) for value in reading.split("+")],
             "labs": [lab_named(name) for name in re.findall(r"`([a-z_]+)`", labs)],
             "optional": [lab_named(name) for name in re.findall(r"`([a-z_]+)`", optional)],
             "minutes": int(minutes)} for day, notebooks, reading, labs, optional, minutes in rows]


def test_every_day_fits_its_minutes_from_the_notebooks_and_the_labs_table():
    """A day's minutes are its notebooks' reading and its graded labs' times (labs/README.md);
    each fits the class day; each notebook's reading, over its days, is its stated student time;
    every lab is planned once, graded or optional as the syllabus's notebook sections say."""
    syllabus = SYLLABUS.read_text()
    length = int(re.search(r"A class day is (\d+) minutes", syllabus).group(1))
    student_time = {int(number): int(minutes) for number, minutes in re.findall(
        r"^### (\d) · .*\n\nStudent time: about (\d+) minutes", syllabus, re.M)}
    assert sorted(student_time) == list(range(1, len(NOTEBOOKS) + 1))
    plan, times = days(), {lab: minutes for lab, (minutes, _) in lab_table().items()}
    assert [row["day"] for row in plan] == list(range(1, 11))
    read = dict.fromkeys(student_time, 0)
    for row in plan:
        assert len(row["reading"]) == max(len(row["notebooks"]), 1), row
        for number, minutes in zip(row["notebooks"], row["reading"]):
            read[number] += minutes
        work = sum(row["reading"]) + sum(times[lab] for lab in row["labs"])
        assert row["minutes"] == work, f"day {row['day']}: {work} minutes, not {row['minutes']}"
        assert work <= length, f"day {row['day']} needs {work} minutes, a day has {length}"
    assert read == student_time, "a notebook's reading over its days is not its student time"
    optional = set(re.findall(r"`(\d\d_[a-z_]+)` \(optional\)", syllabus))
    graded = [lab for row in plan for lab in row["labs"]]
    extra = [lab for row in plan for lab in row["optional"]]
    assert sorted(graded + extra) == sorted(lab.name for lab in LAB_FOLDERS), "each lab once"
    assert set(extra) == optional, "the plan's optional labs are the sections' optional labs"


def test_the_capstone_has_a_day_an_objective_and_its_points():
    syllabus = SYLLABUS.read_text()
    table = syllabus.split("### The capstone", 1)[1]
    rows = re.findall(r"^\| `(\d\d_[a-z_]+)`[^|]*\| (\d+) \| (\d\.\d) [^|]*\| (\d+) \|$",
                      table, re.M)
    assert {lab for lab, *_ in rows} == {lab.name for lab in LAB_FOLDERS if "capstone" in lab.name}
    planned = {lab: row["day"] for row in days() for lab in row["labs"] + row["optional"]}
    assessed = dict(re.findall(r"^\| (\d\.\d) [^|]*\| ([^|]*) \|$",
                               syllabus.split("## What assesses each objective", 1)[1], re.M))
    for lab, day, objective, points in rows:
        assert planned[lab] == int(day), f"{lab}: the capstone's table and the plan disagree"
        assert lab_table()[lab][1] == int(points), f"{lab}: points other than labs/README.md's"
        assert f"`{lab}`" in assessed[objective], f"{lab}: objective {objective} does not name it"


def test_every_objective_is_assessed_by_a_graded_lab_or_a_graded_question_the_key_answers():
    syllabus = SYLLABUS.read_text()
    table = syllabus.split("## What assesses each objective", 1)[1]
    rows = dict(re.findall(r"^\| (\d\.\d) [^|]*\| ([^|]*) \|$", table, re.M))
    graded = [question for assessed in rows.values()
              for question in re.findall(r"Q (\d\.\d) \(graded", assessed)]
    for objective, assessed in rows.items():
        assert re.search(r"`\d\d_[a-z_]+`|\(graded", assessed), (
            f"objective {objective} is assessed by nothing graded: {assessed}")
        if not re.search(r"`\d\d_[a-z_]+`", assessed):
            assert "(graded" in assessed
    assert len(graded) == len(set(graded)), "a question graded twice"
    key = KEY.read_text()
    for question in graded:
        number, item = question.split(".")
        section = re.search(rf"^## {number} · .*?(?=^## |\Z)", key, re.M | re.S).group(0)
        answer = re.search(rf"^{item}\. \*\*(.*?)(?=^\d\. \*\*|\Z)", section, re.M | re.S)
        assert answer and len(answer.group(1).split()) >= 25, (
            f"Q {question} is graded; the key gives it no reasoned answer")
    prose = " ".join(syllabus.split())
    points = int(re.search(r"graded questions, (\d+) points each", prose).group(1))
    assert f"{len(graded)} graded questions, {points} points each, {len(graded) * points} in all" \
        in prose


def test_counts_are_the_folders():
    """The notebooks and labs the hand-outs count are the ones in tutorials/."""
    for name in ("SYLLABUS.md", "README.md"):
        text = (TUTORIALS / name).read_text()
        notebooks, labs = re.search(r"(\w+) notebooks and (\d+) labs", text).groups()
        assert (WORDS[notebooks], int(labs)) == (len(NOTEBOOKS), len(LAB_FOLDERS)), name
    readme = (TUTORIALS / "README.md").read_text()
    beside, = re.findall(r"\((\d+) beside the notebooks, and two capstones\)", readme)
    assert int(beside) + 2 == len(LAB_FOLDERS)
    assert f"lists the {len(LAB_FOLDERS)} with their times" in readme


def test_notebook_2s_exercise_states_the_limits_its_grader_draws():
    grader = (LABS / "02_tau_past_the_end" / "test_02_tau_past_the_end.py").read_text()
    low, high = map(int, re.search(r"limits = sorted\(rng\.sample\(range\((\d+), (\d+)\)",
                                   grader).groups())
    notebook = (TUTORIALS / "02_why_decoding_is_slow.ipynb").read_text()
    assert f"grader tries {low} to {high - 1})" in notebook


def test_notebook_5_prints_the_loop_the_code_holds():
    """Notebook 5 prints generate_dflash's loop from its source: its saved output is today's
    loop (run tutorials/execute.py on it after changing the loop)."""
    import inspect

    import generate

    lines = inspect.getsource(generate.generate_dflash).splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("while "))
    indent = len(lines[first]) - len(lines[first].lstrip())
    last = next(i for i in range(first + 1, len(lines))
                if len(lines[i]) - len(lines[i].lstrip()) <= indent)
    loop = "\n".join(line[indent:] for line in lines[first:last])
    cells = json.loads((TUTORIALS / "05_fast_generation.ipynb").read_text())["cells"]
    printed = ["".join(output.get("text", "")) for cell in cells
               if "getsource(generate_dflash)" in "".join(cell["source"])
               for output in cell.get("outputs", [])]
    assert printed and printed[0].rstrip("\n") == loop, "notebook 5 prints an older loop"


def test_notebook_run_times_are_stated_once_in_the_readme():
    """Each notebook's measured run time is in tutorials/README.md's table, and nowhere else."""
    readme = (TUTORIALS / "README.md").read_text()
    times = dict(re.findall(r"^\| \d \| \[[^]]+\]\((0\d_[a-z0-9_]+\.ipynb)\) \| (\d+) s \|", readme,
                            re.M))
    assert sorted(times) == [notebook.name for notebook in NOTEBOOKS]
    for name in ("SYLLABUS.md", "labs/README.md", "INSTRUCTOR_KEY.md"):
        text = (TUTORIALS / name).read_text()
        assert not re.search(r"\bruns? in (about )?\d+ (s|seconds|minutes?)\b", text), name
