"""Write what an instructor hands out: the repository without the labs' answers.

    python tutorials/student_copy.py OUT

OUT gets the repository's files (the project, the weights, the notebooks, every lab's starter and
grader) but no lab's reference answer, no instructor's key, and no text that names either: the
notebooks' "a reference solution is ..." pointers, and the passages of the hand-outs marked
`<!-- instructor only -->` ... `<!-- end instructor only -->`, are cut. The project's own versions
of what the capstones ask for (generate.py's generate_dflash and generate_dflash_tree,
dflash/tree.py's walk) keep their signatures, but their bodies are a stub naming the starter where
the student's version goes, and the notebook outputs that print them are cut. No git history, no
__pycache__ and no .pyc go with it, so nothing can be checked out or loaded from it. It copies
what git holds: a tutorials/ folder with modified or untracked files is refused (outside a git
checkout this cannot be told, and it says so). In OUT, `python -m pytest tutorials/labs` fails
every lab until the student has written it.
"""

from __future__ import annotations

import argparse
import ast
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
    re.compile(r"tests/test_student_copy\.py"),  # holds what the answers look like
    re.compile(r"\.ci/.*"),  # CI grades the answers
)
# Never copied, tracked or not: compiled modules load as the source they came from (a solution's
# .pyc passes its lab), and what a checkout keeps for itself.
CACHES = re.compile(r"(?:^|.*/)(?:__pycache__|\.git|\.venv|\.pytest_cache|\.ipynb_checkpoints"
                    r"|[^/]*\.egg-info)/.*|.*\.py[co]")
# What the capstones ask for, and the lab where each is written: {file: {function: lab}}. In the
# copy each keeps its signature; its body becomes a stub naming that lab's starter.
CAPSTONE_ANSWERS = {
    "generate.py": {"generate_dflash": "09_capstone", "generate_dflash_tree": "09_capstone_tree"},
    "dflash/tree.py": {"walk": "09_capstone_tree"},
}
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


class CannotCopy(Exception):
    """Why the copy is not made, in one line: the tree is not what git holds, or a capstone's
    answer is not where CAPSTONE_ANSWERS says."""


def git(root: Path, *args: str) -> str | None:
    """git's output for `root`'s own checkout; None when `root` is not the top of one (no git, a
    copy made without it, or a folder inside someone else's checkout)."""
    def run(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=root, capture_output=True, text=True,
                              check=True).stdout

    try:
        if Path(run("rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return None
        return run(*args)
    except (OSError, subprocess.CalledProcessError):
        return None


def unclean_tutorials(root: Path) -> list[str] | None:
    """The files under tutorials/ that differ from the last commit (modified, staged, deleted or
    untracked, ignored ones aside), as `git status` lists them; None when git cannot tell."""
    status = git(root, "status", "--porcelain", "--untracked-files=all", "--", "tutorials")
    return None if status is None else status.splitlines()


def repository_files(root: Path) -> list[str]:
    """The files git tracks; every file under `root` when it is not a git checkout. Caches never."""
    tracked = git(root, "ls-files", "--cached", "-z")
    if tracked is not None:
        listed = tracked.split("\0")
    else:
        listed = [path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()]
    return sorted(path for path in listed
                  if path and not CACHES.fullmatch(path) and (root / path).is_file())


def for_students(text: str) -> str:
    """A hand-out's text without the instructor's passages and without anything naming a lab's
    answer."""
    text = KEY_ASIDE.sub("", INSTRUCTOR_ONLY.sub("", text))
    return GRADING_ANSWERS.sub("", SENTENCE_NAMING.sub("", POINTER.sub("", text)))


# ------------------------------------------------------------------ the capstones' answers


def answer_functions(source: str, where: str, names) -> dict[str, ast.FunctionDef]:
    """The functions `names` of `source`, by name: every one must be there, or the copy would
    hand out an answer that moved."""
    found = {node.name: node for node in ast.walk(ast.parse(source, filename=where))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names}
    missing = sorted(set(names) - set(found))
    if missing:
        raise CannotCopy(f"{where} has no function {', '.join(missing)}: the capstone's answer "
                         f"moved; update CAPSTONE_ANSWERS in tutorials/student_copy.py")
    return found


def body_lines(function: ast.FunctionDef, lines: list[str]) -> tuple[int, int]:
    """The 0-based range [first, end) of the lines holding `function`'s body, docstring in: whole
    lines, so the body must start on a line of its own."""
    first = function.body[0]
    if lines[first.lineno - 1][:first.col_offset].strip():
        raise CannotCopy(f"{function.name}'s body shares a line with its `def`: give it its own")
    return first.lineno - 1, function.body[-1].end_lineno


def stub(name: str, lab: str, indent: str) -> str:
    """The body a capstone's function gets in the copy: where the student's version goes."""
    starter = f"tutorials/labs/{lab}/starter.py"
    return (f'{indent}"""Lab {lab}\'s answer, cut from the student copy: yours to write in\n'
            f'{indent}{starter}."""\n'
            f'{indent}raise NotImplementedError(\n'
            f'{indent}    "{name} is lab {lab}\'s answer, not in the student copy: "\n'
            f'{indent}    "write it in {starter}")')


def without_answers(source: str, where: str) -> str:
    """`source` with the bodies of its CAPSTONE_ANSWERS replaced by stubs; every other byte kept."""
    names = CAPSTONE_ANSWERS[where]
    lines = source.split("\n")  # as the parser counts lines
    for name, function in sorted(answer_functions(source, where, names).items(),
                                 key=lambda item: -item[1].lineno):
        first, end = body_lines(function, lines)  # bottom up: the lines above keep their numbers
        indent = lines[first][:function.body[0].col_offset]
        lines[first:end] = stub(name, names[name], indent).split("\n")
    stubbed = "\n".join(lines)
    for name, function in answer_functions(stubbed, where, names).items():
        if [type(node) for node in function.body] != [ast.Expr, ast.Raise]:
            raise CannotCopy(f"{where}: {name}'s body could not be cut whole")
    return stubbed


def answer_lines(root: Path) -> set[str]:
    """The lines that open a statement of the capstones' answers as `root` holds them, comments
    cut, those long enough to say something (`path = [0]` could be anyone's) and found nowhere
    else in their file: what the copy must not show."""
    found = set()
    for where, names in CAPSTONE_ANSWERS.items():
        source = (root / where).read_text(encoding="utf-8")
        lines = source.split("\n")
        for function in answer_functions(source, where, names).values():
            starts = {node.lineno for statement in function.body[1:] for node in ast.walk(statement)
                      if isinstance(node, ast.stmt)}  # the docstring says what, not how
            if ast.get_docstring(function) is None:
                starts |= {function.body[0].lineno}
            found |= {code_of(lines[start - 1]) for start in starts
                      if len(code_of(lines[start - 1])) >= 20}
        # a line the rest of the file holds too (the plain loop's bookkeeping) says nothing
        found -= {code_of(line) for line in without_answers(source, where).split("\n")}
    return found


def code_of(line: str) -> str:
    """A line of Python without its indentation and its comment."""
    return line.split("  #")[0].split("# ")[0].strip() if "#" in line else line.strip()


def prints_an_answer(cell: dict, answers: set[str]) -> bool:
    """Whether a code cell shows a capstone's code: it asks for a stubbed function's source, or
    an output holds a line of one."""
    source = "".join(cell["source"])
    asks = "getsource" in source and any(
        re.search(rf"\b{name}\b", source) for names in CAPSTONE_ANSWERS.values() for name in names)
    shown = "\n".join("".join(output.get("text", "")) + "".join(
        output.get("data", {}).get("text/plain", "")) for output in cell.get("outputs", []))
    return asks or any(code_of(line) in answers for line in shown.splitlines())


# What a cell that printed a capstone's answer shows in the copy.
CUT = {"name": "stdout", "output_type": "stream",
       "text": ["(cut from the student copy: this printed the project's version of what the "
                "capstone, lab 09_capstone, asks you to write)\n"]}


def notebook_for_students(raw: str, answers: set[str] = frozenset()) -> str:
    """A notebook with its markdown cells cut as `for_students` cuts a hand-out; outputs kept as
    executed, except those of cells that print a capstone's answer (`answers`' lines)."""
    notebook = json.loads(raw)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = for_students("".join(cell["source"])).splitlines(keepends=True)
        elif cell["cell_type"] == "code" and prints_an_answer(cell, answers):
            cell["outputs"] = [CUT]
    indent = 1 if raw.startswith('{\n "') else 2
    return json.dumps(notebook, indent=indent, ensure_ascii=False) + "\n"


def write_copy(out: Path, root: Path = ROOT) -> int:
    """Copy the repository at `root` into `out` for students; the number of files written."""
    answers = answer_lines(root)
    written = 0
    for path in repository_files(root):
        if any(pattern.fullmatch(path) for pattern in LEFT_OUT):
            continue
        source, target = root / path, out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path in CAPSTONE_ANSWERS:
            target.write_text(without_answers(source.read_text(encoding="utf-8"), path),
                              encoding="utf-8")
        elif path.endswith(".ipynb"):
            target.write_text(notebook_for_students(source.read_text(encoding="utf-8"), answers),
                              encoding="utf-8")
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


def destination_problem(out: Path, root: Path = ROOT) -> str | None:
    """Why `out` cannot take the copy, or None: it must be new or an empty folder (never a link,
    which would send the copy elsewhere), outside the repository, in a folder that exists."""
    if out.is_symlink():
        return f"{out} is a symbolic link: give a plain new folder"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return f"{out} exists and is not an empty folder: give a new one"
    if out.resolve().is_relative_to(root.resolve()):
        return f"{out} lies inside the repository: give a folder outside it"
    if not out.absolute().parent.is_dir():
        return f"{out.absolute().parent} is not a folder: make it first"
    return None


def write_whole(out: Path, root: Path = ROOT) -> int:
    """`write_copy` into a hidden sibling of `out`, renamed to `out` once complete: a copy stopped
    by a full disk, a read-only mount or Ctrl-C leaves nothing behind. The number of files."""
    out = out.absolute()
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        count = write_copy(partial, root)
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


def unclean_problem(root: Path) -> str | None:
    """Why `root`'s tutorials/ cannot be copied, or None: a file git does not hold as committed
    (a student's edit, an answer being written) would go out unseen. Outside a git checkout this
    cannot be told: one note says so, and the copy goes on."""
    unclean = unclean_tutorials(root)
    if unclean is None:
        print("note: not a git checkout: modified or untracked files cannot be told apart; "
              "copying every file but caches (__pycache__, .pyc)", file=sys.stderr)
        return None
    if not unclean:
        return None
    listed = ", ".join(line[3:] for line in unclean[:3]) + (
        f" and {len(unclean) - 3} more" if len(unclean) > 3 else "")
    return (f"tutorials/ has {len(unclean)} modified or untracked file(s) ({listed}): commit or "
            f"remove them, then copy")


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    try:
        out = build_parser().parse_args(argv).out
    except SystemExit as exit:  # a bad command line (2), or --help (0)
        return exit.code
    problem = destination_problem(out, root) or unclean_problem(root)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        count = write_whole(out, root)
    except CannotCopy as problem:
        print(f"error: {problem}; nothing was written", file=sys.stderr)
        return 2
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
