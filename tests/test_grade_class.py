"""tutorials/grade_class.py grades a class: a made-up class of 30 students over two quick labs,
honest, wrong and hostile submissions mixed, graded once (the `graded` fixture), then read row by
row.

A hostile submission that would act from inside the grader's process (forge the report and exit,
patch the grader) is refused before it runs: the labs read a submission first
(`_lab_helpers.load_submission`).
"""

import csv
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from snapshots import assert_untouched, tree_bytes

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "tutorials" / "labs"
HISTOGRAM, CACHE = "05_histogram", "05_concat_cache"  # the quickest graders: no model, a second
TIMEOUT = 30  # seconds: the looping submission's cost, and several times an honest one's


def load_grade_class():
    path = ROOT / "tutorials" / "grade_class.py"
    spec = importlib.util.spec_from_file_location("grade_class", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


grade_class = load_grade_class()


def shipped(lab: str, name: str) -> str:
    return (LABS / lab / name).read_text()


def unwritten(lab: str, before: str = "", after: str = "") -> str:
    """The shipped starter with `before` run first, at import, and `after` last."""
    starter = shipped(lab, "starter.py")
    return textwrap.dedent(before) + "\n" + starter + "\n" + textwrap.dedent(after)


# what a student's process can do at import, before any check runs
LOOPS = "while True:\n    pass\n"
ALLOCATES = "hoard = bytearray(50 * 2**30)  # 50 GB\n"
EXITS = "import os\nos._exit(0)\n"
REPORT = ('<testsuites><testsuite name="pytest" tests="1"><testcase classname="grader" name="{}"/>'
          "</testsuite></testsuites>")
FAKES_REPORT = f"""
    import sys
    path = next(arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--junitxml="))
    open(path, "w").write({REPORT!r}.format("test_histogram"))
    print("1 passed")
"""
FAKES_REPORT_AND_EXITS = textwrap.dedent(FAKES_REPORT) + "import os\nos._exit(0)\n"
READS_ANSWER = """
    import importlib.util
    from pathlib import Path
    import _lab_helpers
    for path in (Path(__file__).with_name("solution.py"),
                 _lab_helpers.LABS / Path(__file__).parent.name / "solution.py"):
        if not path.exists():
            continue
        spec = importlib.util.spec_from_file_location("answer", path)
        answer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(answer)
        globals().update(vars(answer))
"""
TAMPERS = '''
    import sys
    grader = next(module for name, module in list(sys.modules.items())
                  if name.endswith("test_05_histogram"))
    grader.per_position_acceptance = lambda lengths, block: [0.5] * (block - 1)
    grader.math = type("AlwaysClose", (), {"isclose": staticmethod(lambda *args, **kwargs: True)})


    def tau_from_histogram(histogram):
        return 0.0


    def per_slot_from_histogram(histogram):
        return [0.5] * (len(histogram) - 1)
'''

HONEST = "honest"
PREFIX = {HISTOGRAM: "h", CACHE: "c"}  # a hostile or wrong student's name: h_loops, c_exits
# (lab, kind): the starter.py it hands in; "link" is a link to the instructor's solution.py
SUBMISSIONS = {
    "honest": lambda lab: shipped(lab, "solution.py"),
    "unwritten": lambda lab: shipped(lab, "starter.py"),
    "wrong": lambda lab: shipped(lab, "solution.py").replace(
        "/ sum(histogram)", "/ len(histogram)").replace("[:, :, :length]", "[:, :, :length - 1]"),
    "loops": lambda lab: unwritten(lab, LOOPS),
    "allocates": lambda lab: unwritten(lab, ALLOCATES),
    "exits": lambda lab: unwritten(lab, EXITS),
    "fakes_report": lambda lab: unwritten(lab, FAKES_REPORT),
    "reads_answer": lambda lab: unwritten(lab, after=READS_ANSWER),
    "fakes_report_and_exits": lambda lab: unwritten(lab, FAKES_REPORT_AND_EXITS),
    "tampers": lambda lab: textwrap.dedent(TAMPERS),
}
GAPS = ("fakes_report_and_exits", "tampers")  # what only a submission read before it runs stops
HISTOGRAM_KINDS = [*SUBMISSIONS, "link"]
CACHE_KINDS = ["unwritten", "wrong"]


def the_class() -> dict[str, dict[str, str | None]]:
    """{student: {lab: kind}}: the hostile and wrong ones each hand in one lab, a few students
    both labs honestly, the rest nothing (30 in all)."""
    students = {f"h_{kind}": {HISTOGRAM: kind} for kind in HISTOGRAM_KINDS}
    students |= {f"c_{kind}": {CACHE: kind} for kind in CACHE_KINDS}
    students |= {f"honest_{n}": {HISTOGRAM: HONEST, CACHE: HONEST} for n in range(1)}
    students |= {f"absent_{n}": {} for n in range(30 - len(students))}
    return students


def hand_in(folder: Path, lab: str, kind: str) -> None:
    (folder / lab).mkdir(parents=True)
    if kind == "wrong":
        assert SUBMISSIONS[kind](lab) != shipped(lab, "solution.py"), f"{lab}: no wrong answer made"
    if kind == "link":
        (folder / lab / "starter.py").symlink_to(LABS / lab / "solution.py")
    else:
        (folder / lab / "starter.py").write_text(SUBMISSIONS[kind](lab))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once: (its {student: {lab: kind}}, the CSV's rows, the command's status)."""
    submissions = tmp_path_factory.mktemp("class")
    students = the_class()
    for student, labs in students.items():
        (submissions / student).mkdir()
        for lab, kind in labs.items():
            hand_in(submissions / student, lab, kind)
    out = tmp_path_factory.mktemp("grades") / "grades.csv"
    status = grade_class.main([str(submissions), "--out", str(out),
                               "--labs", f"{HISTOGRAM},{CACHE}",
                               "--timeout", str(TIMEOUT), "--memory-gb", "4", "--jobs", "2",
                               "--seed", "1234"])
    with open(out, newline="") as file:
        header = next(csv.reader(file))
        file.seek(0)
        rows = list(csv.DictReader(file))
    return students, header, rows, status


def row(rows, student: str, lab: str) -> dict:
    [found] = [r for r in rows if (r["student"], r["lab"]) == (student, lab)]
    return found


def test_one_row_per_student_and_lab(graded):
    students, header, rows, status = graded
    assert status == 0
    assert header == ["student", "lab", "points", "max_points", "seed", "message"]
    assert sorted((r["student"], r["lab"]) for r in rows) == sorted(
        (student, lab) for student in students for lab in (HISTOGRAM, CACHE))
    assert {r["seed"] for r in rows} == {"1234"}
    points = grade_class.lab_points()
    assert all(int(r["max_points"]) == points[r["lab"]] for r in rows)


def test_honest_submissions_get_full_marks(graded):
    students, _, rows, _ = graded
    honest = [(student, lab) for student, labs in students.items()
              for lab, kind in labs.items() if kind == HONEST]
    assert len(honest) >= 3
    for student, lab in honest:
        got = row(rows, student, lab)
        assert (int(got["points"]), got["message"]) == (int(got["max_points"]), "passed"), got


@pytest.mark.parametrize("lab, kind", [(HISTOGRAM, kind) for kind in HISTOGRAM_KINDS
                                       if kind not in (*GAPS, HONEST)]
                         + [(CACHE, kind) for kind in CACHE_KINDS])
def test_wrong_and_hostile_submissions_get_nothing(graded, lab, kind):
    _, _, rows, _ = graded
    got = row(rows, f"{PREFIX[lab]}_{kind}", lab)
    assert int(got["points"]) == 0, got
    assert got["message"] and got["message"] != "passed", got


@pytest.mark.parametrize("kind", GAPS)
def test_in_process_cheats_get_nothing(graded, kind):
    _, _, rows, _ = graded
    assert int(row(rows, f"h_{kind}", HISTOGRAM)["points"]) == 0


def test_messages_say_why(graded):
    _, _, rows, _ = graded
    assert "timed out after 30 s" in row(rows, "h_loops", HISTOGRAM)["message"]
    assert "not written yet" in row(rows, "h_unwritten", HISTOGRAM)["message"]
    # os._exit at import: refused before it runs, by the labs' reading of a submission
    assert "import of os" in row(rows, "h_exits", HISTOGRAM)["message"]
    assert "link" in row(rows, "h_link", HISTOGRAM)["message"]
    assert row(rows, "absent_0", CACHE)["message"] == "not submitted"
    assert row(rows, "h_wrong", CACHE)["message"] == "not submitted"


def test_every_lab_has_points():
    assert set(grade_class.lab_points()) == {p.name for p in LABS.iterdir() if p.is_dir() and
                                             p.name[:2].isdigit()}


def report(tmp_path: Path, *cases: str) -> Path:
    path = tmp_path / "report.xml"
    path.write_text("<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>")
    return path


PASSED = '<testcase name="{}"/>'
FAILED = '<testcase name="{}"><failure message="lab: off by one">long story</failure></testcase>'


def test_verdict_needs_the_report_and_the_status_to_agree(tmp_path):
    verdict, tests = grade_class.verdict, {"test_a", "test_b", "test_c"}
    three = report(tmp_path, *(PASSED.format(name) for name in sorted(tests)))
    assert verdict(0, three, tests, 10).points == 10
    assert verdict(1, three, tests, 10).points == 0  # all passed, yet pytest failed
    assert verdict(0, tmp_path / "missing.xml", tests, 10).points == 0
    assert verdict(0, report(tmp_path, PASSED.format("test_a")), tests, 10).points == 0
    partial = report(tmp_path, PASSED.format("test_a"), PASSED.format("test_b"),
                     FAILED.format("test_c"))
    assert verdict(0, partial, tests, 10).points == 0  # a failure, yet pytest passed
    got = verdict(1, partial, tests, 10)
    assert (got.points, got.message) == (6, "1 of 3 failed: lab: off by one")  # 10 x 2 / 3, down
    assert verdict(2, partial, tests, 10).points == 0  # interrupted
    (tmp_path / "garbage.xml").write_text("<testsuites><testcase")
    assert verdict(0, tmp_path / "garbage.xml", tests, 10).points == 0


def refused(argv, capsys, *fragments) -> None:
    """grade_class.main(argv) exits 2 with one `error:` line holding every fragment."""
    capsys.readouterr()
    status = grade_class.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_command_lines_are_refused_before_any_grading(tmp_path, capsys):
    submissions = tmp_path / "class"
    (submissions / "ada" / HISTOGRAM).mkdir(parents=True)
    (submissions / "ada" / HISTOGRAM / "starter.py").write_text(shipped(HISTOGRAM, "solution.py"))
    grader = LABS / HISTOGRAM / f"test_{HISTOGRAM}.py"
    before = tree_bytes(submissions, LABS)
    refused([str(submissions), "--out", str(submissions / "ada" / "grades.csv")], capsys,
            "inside the submissions")
    refused([str(submissions), "--out", str(grader)], capsys, "inside tutorials/labs")
    refused([str(submissions), "--out", str(tmp_path / "g.csv"), "--labs", "05_histogrm"], capsys,
            "05_histogrm")
    refused([str(tmp_path / "nowhere"), "--out", str(tmp_path / "g.csv")], capsys, "not a folder")
    refused([str(submissions), "--out", str(tmp_path / "g.csv"), "--jobs", "0"], capsys, "--jobs")
    refused([str(submissions), "--out", str(tmp_path / "g.csv"), "--seed", "-1"], capsys, "--seed")
    assert_untouched(before, submissions, LABS)
    assert not (tmp_path / "g.csv").exists()


def test_a_message_is_never_a_spreadsheet_formula(tmp_path):
    """A student can choose a failure's text (pytest.fail("=HYPERLINK(...)")): written inert."""
    out = tmp_path / "grades.csv"
    rows = [dict(student="ada", lab=HISTOGRAM, points=0, max_points=10, seed=1, message=message)
            for message in ("=HYPERLINK(\"x\")", "passed")]
    grade_class.write_csv(out, rows)
    with open(out, newline="") as file:
        assert [r["message"] for r in csv.DictReader(file)] == ["'=HYPERLINK(\"x\")", "passed"]


def test_a_students_own_run_prints_its_seed():
    """pytest's header names the seed the graders draw from, and how to replay it."""
    env = {key: value for key, value in os.environ.items() if key != "DFLASH_LABS_SEED"}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
               f"tutorials/labs/{HISTOGRAM}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^labs seed: (\d+) \(DFLASH_LABS_SEED=\1 replays it\)$", done.stdout, re.M), (
        done.stdout)
