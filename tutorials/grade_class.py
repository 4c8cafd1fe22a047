"""Grade a class in one command: every student's labs, each in its own process, into one CSV.

    python tutorials/grade_class.py SUBMISSIONS --out grades.csv

SUBMISSIONS holds one folder per student, and in it one folder per lab, named as under
tutorials/labs, with the student's `starter.py`: `SUBMISSIONS/ada/01_gqa/starter.py`. A lab a
student has no folder for scores 0, "not submitted".

The graders are this repository's, never a submission's. Each (student, lab) runs in a fresh
process, in a fresh folder that holds the project, the lab's grader and the student's starter.py,
and no lab's answer (no solution.py), under a time limit and a memory cap: an endless loop or a
huge allocation costs that lab its points, not the run. The verdict is read here, from the
child's exit status and the JUnit report pytest writes into a folder of this process's making;
a report that does not list exactly the grader's tests (as collected here, before any student's
code ran), or disagrees with the exit status, scores 0.

Points come from tutorials/labs/README.md's table. A lab whose grader has several tests gives
partial credit: points = max points x passed / tests, rounded down.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dflash.checkpoint import write_atomically
from dflash.cli import (HelpWithDefaults, OneLineErrors, UsageError, check_output, positive,
                        positive_int, run_cli)
from dflash.cli import seed as seed_number

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "tutorials" / "labs"
# what a grader's process needs of the repository: the project, the demo pair, the labs' shared
# tools; a lab's own folder adds its grader and the student's starter.py, never solution.py
PROJECT_FILES = ("dflash", "generate.py", "train.py", "pyproject.toml", "weights", "tests/fixtures",
                 "tutorials/teaching.py", "tutorials/labs/_lab_helpers.py",
                 "tutorials/labs/conftest.py")
COLUMNS = ("student", "lab", "points", "max_points", "seed", "message")
REPORT_LIMIT = 1 << 20  # bytes of JUnit report read back; pytest's for one lab is a few KB
FILE_LIMIT = 64 << 20  # the largest file a grader's process may write (its report, its output)
# the child's first act: cap its own memory and file sizes, then become pytest (an exec, not a
# preexec_fn: that is unsafe in a parent that runs --jobs threads)
CAPPED = ("import os, resource, sys\n"
          "memory, files = int(sys.argv[1]), int(sys.argv[2])\n"
          "resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\n"
          "resource.setrlimit(resource.RLIMIT_FSIZE, (files, files))\n"
          "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])\n")


def lab_points() -> dict[str, int]:
    """{lab: points} from tutorials/labs/README.md's table, where a lab's points are stated."""
    rows = re.findall(r"^\| (\d\d_[a-z_]+) \|.*\| \d+ min \| (\d+) \|",
                      (LABS / "README.md").read_text(), re.M)
    return {lab: int(points) for lab, points in rows}


@dataclass
class Grade:
    """One row of the CSV, without the student, lab and seed that every row of a run shares."""
    points: int
    max_points: int
    message: str


def project_files(labs: list[str]) -> dict[str, bytes]:
    """{path: bytes} of what every grader's process needs (PROJECT_FILES) and the labs' graders,
    read once, before any student's code runs: a submission runs as your user and could rewrite
    this repository's graders, but no later student is graded by what it wrote."""
    files = {}
    for name in [*PROJECT_FILES, *(grader_of(lab).relative_to(ROOT).as_posix() for lab in labs)]:
        source = ROOT / name
        found = sorted(source.rglob("*")) if source.is_dir() else [source]
        for path in found:
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    return files


def build_project(into: Path, files: dict[str, bytes], labs: list[str]) -> None:
    """Write `files` into `into`, with only the graders of `labs`: copies, not links, so that a
    submission can neither reach this repository through them nor change it by writing to them."""
    graders = {grader_of(lab).relative_to(ROOT).as_posix() for lab in labs}
    for name, data in files.items():
        if name.startswith("tutorials/labs/") and name.count("/") == 3 and name not in graders:
            continue  # another lab's grader
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(data)


def grader_of(lab: str) -> Path:
    """The lab's grader in this repository: `test_<lab>.py`."""
    return LABS / lab / f"test_{lab}.py"


def child_environment(seed: int) -> dict[str, str]:
    """The environment a grader runs in: the class's seed, the starters graded, no pytest options
    or plugins from the instructor's shell."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTEST_", "DFLASH_LABS"))}
    env.update(DFLASH_LABS="starters", DFLASH_LABS_SEED=str(seed), PYTHONDONTWRITEBYTECODE="1")
    return env


def expected_tests(files: dict[str, bytes], labs: list[str], seed: int,
                   timeout: float) -> dict[str, set[str]]:
    """{lab: the names of its grader's tests}, as pytest collects them in a project without any
    submission: what a child's report must list, exactly. Collecting imports the graders, never a
    starter (the `lab` fixture loads it when a test runs)."""
    with tempfile.TemporaryDirectory(prefix="grade-collect-") as folder:
        project = Path(folder)
        build_project(project, files, labs)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "--rootdir", str(project), "-c", str(project / "pyproject.toml"), "tutorials/labs"],
            cwd=project, env=child_environment(seed), capture_output=True, text=True,
            timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"the graders do not collect:\n{run.stdout}{run.stderr}")
    tests = {lab: set() for lab in labs}
    for line in run.stdout.splitlines():
        match = re.match(r"tutorials/labs/(\d\d_[a-z_]+)/test_\w+\.py::(\S+)$", line)
        if match:
            tests[match[1]].add(match[2])
    if not all(tests.values()):  # points are shared out over a lab's tests
        raise RuntimeError(f"no tests collected for {[lab for lab in labs if not tests[lab]]}")
    return tests


def submitted_file(student: Path, lab: str) -> tuple[Path | None, str]:
    """The student's starter.py for `lab`, or None and why it cannot be graded. A link is refused:
    it could point at the instructor's solution.py."""
    folder, starter = student / lab, student / lab / "starter.py"
    if not folder.exists() and not folder.is_symlink():
        return None, "not submitted"
    if folder.is_symlink() or starter.is_symlink():
        return None, f"{lab}/starter.py is reached through a link; hand in the file itself"
    if not starter.is_file():
        return None, f"{lab}/starter.py is missing or not a file"
    return starter, ""


def run_grader(files: dict[str, bytes], starter: Path, lab: str, seed: int, timeout: float,
               memory_gb: float, tests: set[str], max_points: int) -> Grade:
    """Grade one starter.py in its own process, in a fresh copy of the project; the verdict is
    read from the process's exit status and its JUnit report, in a folder the child is not in."""
    with tempfile.TemporaryDirectory(prefix="grade-") as folder:
        project, results = Path(folder) / "project", Path(tempfile.mkdtemp(dir=folder))
        build_project(project, files, [lab])
        lab_folder = project / "tutorials" / "labs" / lab
        shutil.copyfile(starter, lab_folder / "starter.py")
        report = results / "report.xml"
        command = [sys.executable, "-c", CAPPED, str(int(memory_gb * 2**30)), str(FILE_LIMIT),
                   "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(project),
                   "-c", str(project / "pyproject.toml"), f"--junitxml={report}",
                   "-o", "junit_family=xunit2", str(lab_folder / grader_of(lab).name)]
        with open(results / "output.txt", "wb") as output:
            status = run_capped(command, project, child_environment(seed), output, timeout)
        if status is None:
            return Grade(0, max_points, f"timed out after {timeout:g} s (an endless loop?)")
        result = verdict(status, report, tests, max_points)
        if result.message.startswith("no report"):  # pytest's last words, if any: a crash's cause
            result.message += last_line(results / "output.txt")
        return result


class Running:
    """The graders' processes now running, so that Ctrl-C ends them too: each runs in a session of
    its own (its process group is killed whole), which the terminal's Ctrl-C does not reach."""
    children: set[subprocess.Popen] = set()
    stopping = threading.Event()

    @classmethod
    def stop(cls) -> None:
        cls.stopping.set()
        for child in list(cls.children):
            end_process_group(child)


def run_capped(command: list[str], cwd: Path, env: dict, output, timeout: float) -> int | None:
    """Run the child in its own session; its exit status, or None when it ran out of time (then it
    is killed, with everything it started in its process group)."""
    if Running.stopping.is_set():
        raise KeyboardInterrupt
    child = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
                             stderr=output, start_new_session=True)
    Running.children.add(child)
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        end_process_group(child)
        Running.children.discard(child)


def last_line(output: Path) -> str:
    """`: <the output's last line>`, or nothing when the child printed nothing."""
    with open(output, "rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
        lines = file.read().decode(errors="replace").strip().splitlines()
    return f": {lines[-1].strip()[:300]}" if lines else ""


def end_process_group(child: subprocess.Popen) -> None:
    """Kill what is left of the child's process group (the child, and anything it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def verdict(status: int, report: Path, tests: set[str], max_points: int) -> Grade:
    """Points from pytest's exit status and JUnit report. The report must list exactly the
    grader's tests; status 0 means every one passed, 1 that some failed; anything else, or a
    report that disagrees, scores 0."""
    if not report.is_file():
        return Grade(0, max_points, f"no report: the grader's process ended with status {status}")
    try:
        with open(report, "rb") as file:
            cases = ElementTree.fromstring(file.read(REPORT_LIMIT)).iter("testcase")
            outcomes = {case.get("name"): [child for child in case] for case in cases}
    except ElementTree.ParseError:
        return Grade(0, max_points, "the grader's report is unreadable")
    if set(outcomes) != tests:
        return Grade(0, max_points, "the grader's report does not list the grader's tests")
    failed = [name for name, children in outcomes.items()
              if any(child.tag in ("failure", "error", "skipped") for child in children)]
    if (status, bool(failed)) not in ((0, False), (1, True)):
        return Grade(0, max_points, f"the grader's process ended with status {status}")
    points = max_points * (len(tests) - len(failed)) // len(tests)
    if not failed:
        return Grade(points, max_points, "passed")
    first = next(child for child in outcomes[sorted(failed)[0]]
                 if child.tag in ("failure", "error", "skipped"))
    reason = (first.get("message") or first.text or first.tag).strip().splitlines() or [first.tag]
    reason = reason[0].removeprefix("Failed: ")[:300]  # pytest.fail's prefix
    return Grade(points, max_points, f"{len(failed)} of {len(tests)} failed: {reason}")


def write_csv(out: Path, rows: list[dict]) -> None:
    """The grades, one row per student and lab, written whole or not at all. A message a
    spreadsheet would run as a formula (a student can choose a failure's text) starts with '."""
    def write(path: str) -> None:
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, COLUMNS)
            writer.writeheader()
            for row in rows:
                inert = "'" if row["message"].startswith(("=", "+", "-", "@")) else ""
                writer.writerow({**row, "message": inert + row["message"]})
    write_atomically(out, write)


def students_in(submissions: Path) -> list[Path]:
    """The class: SUBMISSIONS' folders, by name (hidden ones left out)."""
    if not submissions.is_dir():
        raise UsageError(f"{submissions}: not a folder of submissions")
    students = sorted(path for path in submissions.iterdir()
                      if path.is_dir() and not path.name.startswith("."))
    if not students:
        raise UsageError(f"{submissions}: no student folders in it")
    return students


def chosen_labs(option: str | None, points: dict[str, int]) -> list[str]:
    """--labs, checked against the labs that exist and have points; every lab when not given."""
    if option is None:
        return sorted(lab for lab in points if grader_of(lab).is_file())
    labs = [name.strip() for name in option.split(",") if name.strip()]
    unknown = [lab for lab in labs if lab not in points or not grader_of(lab).is_file()]
    if unknown or not labs:
        raise UsageError(f"--labs: no lab named {unknown[0] if unknown else option!r}"
                         f" (the folders under tutorials/labs, e.g. 01_gqa)")
    return list(dict.fromkeys(labs))


def check_out(out: Path, submissions: Path) -> None:
    """Refuse an --out that would overwrite a submission or one of the labs' files."""
    where = out.resolve()
    for folder, what in ((submissions.resolve(), "the submissions"),
                         (LABS.resolve(), "tutorials/labs")):
        if where == folder or folder in where.parents:
            raise UsageError(f"--out {out}: inside {what}; write the grades elsewhere")
    check_output(out, "--out")


def grade(args) -> int:
    """Check the command line, draw and print the seed, grade every (student, lab) pair, write the
    CSV."""
    points = lab_points()
    students = students_in(args.submissions)
    labs = chosen_labs(args.labs, points)
    check_out(args.out, args.submissions)
    drawn = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {drawn} (replay with --seed {drawn})", flush=True)
    files = project_files(labs)
    tests = expected_tests(files, labs, drawn, args.timeout)
    pairs = [(student, lab) for student in students for lab in labs]

    def one(pair) -> Grade:
        student, lab = pair
        starter, why = submitted_file(student, lab)
        if starter is None:
            return Grade(0, points[lab], why)
        return run_grader(files, starter, lab, drawn, args.timeout, args.memory_gb, tests[lab],
                          points[lab])

    grades = {}
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    try:
        running = {pool.submit(one, pair): pair for pair in pairs}
        for done in tqdm(concurrent.futures.as_completed(running), total=len(pairs),
                         desc="grading", unit="lab"):
            grades[running[done]] = done.result()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        Running.stop()
        raise
    finally:
        pool.shutdown()
    rows = [dict(student=student.name, lab=lab, seed=drawn, **vars(grades[student, lab]))
            for student, lab in pairs]
    write_csv(args.out, rows)
    print(f"{len(students)} students x {len(labs)} labs graded: {args.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    parse = OneLineErrors(
        prog="grade_class.py", formatter_class=HelpWithDefaults,
        description="Grade every student's labs, each in its own process, into one CSV.",
        epilog="example: python tutorials/grade_class.py submissions/ --out grades.csv "
               "--labs 01_gqa,01_rope --jobs 2\n"
               "SUBMISSIONS/<student>/<lab>/starter.py is graded by this repository's "
               "tutorials/labs/<lab>/test_<lab>.py; a missing lab scores 0.")
    parse.add_argument("submissions", type=Path, metavar="SUBMISSIONS",
                       help="one folder per student, one folder per lab in it")
    parse.add_argument("--out", type=Path, required=True,
                       help="the CSV: student, lab, points, max_points, seed, message")
    parse.add_argument("--labs", help="the labs to grade, comma-separated (default: all)")
    parse.add_argument("--seed", type=seed_number,
                       help="the graders' seed (default: drawn, and printed)")
    parse.add_argument("--timeout", type=positive, default=120.0,
                       help="seconds one student's lab may run")
    parse.add_argument("--memory-gb", type=positive, default=8.0,
                       help="memory one student's lab may map")
    parse.add_argument("--jobs", type=positive_int, default=1, help="labs graded at once")
    return parse


def main(argv: list[str] | None = None) -> int:
    return run_cli(parser(), grade, argv)


if __name__ == "__main__":
    sys.exit(main())
