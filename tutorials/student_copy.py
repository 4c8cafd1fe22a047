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

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad command line is one `error:` line and exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, metavar="OUT",
                        help="a new (or empty) folder outside the repository")
    return parser


def destination_problem(out: Path) -> str | None:
    """Why `out` cannot take the copy, or None: it must be new or an empty folder (never a link,
    which would send the copy elsewhere), outside the repository, in a folder that exists."""
    if out.is_symlink():
        return f"{out} is a symbolic link: give a plain new folder"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return f"{out} exists and is not an empty folder: give a new one"
    if out.resolve().is_relative_to(ROOT):
        return f"{out} lies inside the repository: give a folder outside it"
    if not out.absolute().parent.is_dir():
        return f"{out.absolute().parent} is not a folder: make it first"
    return None


def write_whole(out: Path) -> int:
    """`write_copy` into a hidden sibling of `out`, renamed to `out` once complete: a copy stopped
    by a full disk, a read-only mount or Ctrl-C leaves nothing behind. The number of files."""
    out = out.absolute()
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        count = write_copy(partial)
        partial.chmod(0o777 & ~current_umask())  # mkdtemp's folder is the owner's only
        os.replace(partial, out)  # over an empty folder, or into a new name
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return count


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    try:
        out = build_parser().parse_args(argv).out
    except SystemExit as exit:  # a bad command line (2), or --help (0)
        return exit.code
    problem = destination_problem(out)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        count = write_whole(out)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); nothing was written", file=sys.stderr)
        return 130
    except OSError as err:  # a read-only place, a full disk
        where = err.filename or out
        print(f"error: {where}: {err.strerror or err}; nothing was written", file=sys.stderr)
        return 2
    print(f"wrote {count} files to {out}: the labs' starters and graders, no reference answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
