"""Write what an instructor hands out: the repository without the labs' answers.

    python tutorials/student_copy.py OUT

OUT gets the repository's files (the project, the weights, the notebooks, every lab's starter and
grader) but no lab's reference answer, no instructor's key, and no text that names either: the
notebooks' "a reference solution is ..." pointers, and the passages of the hand-outs marked
`<!-- instructor only -->` ... `<!-- end instructor only -->`, are cut. No git history goes with
it, so nothing can be checked out of it. In OUT, `python -m pytest tutorials/labs` fails every
lab until the student has written it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = (
    re.compile(r"tutorials/labs/[^/]+/solution\.py"),  # the answers
    re.compile(r"tutorials/INSTRUCTOR_KEY\.md"),
    re.compile(r"tutorials/student_copy\.py"),
    re.compile(r"tests/test_lab_graders\.py"),  # grades the graders with the answers
    re.compile(r"tutorials/grade_class\.py"),  # the instructor's: grades a class
    re.compile(r"tests/test_grade_class\.py"),  # grades a made-up class, the answers among it
    re.compile(r"tests/test_tutorials\.py"),  # checks the key and this copy
    re.compile(r"\.ci/.*"),  # CI grades the answers
)
INSTRUCTOR_ONLY = re.compile(
    r"[ \t]*<!-- instructor only -->.*?<!-- end instructor only -->[ \t]*\n?", re.S
)
# a notebook's pointer to a lab's answer
POINTER = re.compile(r";? ?[Aa] reference solution is `[^`]*`")
# "(Answers in `tutorials/INSTRUCTOR_KEY.md`.)"
KEY_ASIDE = re.compile(r" ?\([^()]*INSTRUCTOR_KEY\.md[^()]*\)")
# any other sentence
SENTENCE_NAMING = re.compile(r"[^.\n]*(?:solution\.py|INSTRUCTOR_KEY\.md)[^.\n]*\.[ \t]*")
# the README's test command
GRADING_ANSWERS = re.compile(r" && DFLASH_LABS=solutions python -m pytest[^\n`]*")


def repository_files() -> list[str]:
    """The files git tracks, and the untracked ones it does not ignore (a lab being added); every
    file under ROOT when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = [
            path.relative_to(ROOT).as_posix()
            for path in ROOT.rglob("*")
            if path.is_file() and ".git" not in path.parts
        ]
    return sorted(path for path in listed if (ROOT / path).is_file())


def for_students(text: str) -> str:
    """A hand-out's text without the instructor's passages and without anything naming a lab's
    answer."""
    text = KEY_ASIDE.sub("", INSTRUCTOR_ONLY.sub("", text))
    return GRADING_ANSWERS.sub("", SENTENCE_NAMING.sub("", POINTER.sub("", text)))


def notebook_for_students(raw: str) -> str:
    """A notebook with its markdown cells cut as `for_students` cuts a hand-out; outputs kept as
    executed."""
    notebook = json.loads(raw)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = for_students("".join(cell["source"])).splitlines(keepends=True)
    indent = 1 if raw.startswith('{\n "') else 2
    return json.dumps(notebook, indent=indent, ensure_ascii=False) + "\n"


def write_copy(out: Path) -> int:
    """Copy the repository into `out` for students; the number of files written."""
    written = 0
    for path in repository_files():
        if any(pattern.fullmatch(path) for pattern in LEFT_OUT):
            continue
        source, target = ROOT / path, out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith(".ipynb"):
            target.write_text(
                notebook_for_students(source.read_text(encoding="utf-8")), encoding="utf-8"
            )
        elif path.endswith(".md"):
            target.write_text(for_students(source.read_text(encoding="utf-8")), encoding="utf-8")
        else:
            shutil.copy2(source, target)
        written += 1
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tutorials/student_copy.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: {out} exists and is not an empty folder: give a new one", file=sys.stderr)
        return 2
    if out.resolve().is_relative_to(ROOT):
        print(f"error: {out} lies inside the repository: give a folder outside it", file=sys.stderr)
        return 2
    count = write_copy(out)
    print(f"wrote {count} files to {out}: the labs' starters and graders, no reference answers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
