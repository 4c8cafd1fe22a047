"""`python tutorials/student_copy.py OUT`: what a student gets holds no lab's answer, the capstones'
included (neither in code, nor in notebook outputs, nor in compiled files), and still runs.

The copy is made once for the module, in process (`write_whole`), so that a working tree with
edits under tutorials/ (which the command refuses) can still run these tests; the refusal itself
is tested on a small git repository of its own.
"""

import ast
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import generate
from dflash import tree

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
LABS = TUTORIALS / "labs"
# The project's versions of what the capstones ask for, and the starter each points to.
CAPSTONES = [(generate.generate_dflash, "generate.py", "09_capstone"),
             (generate.generate_dflash_tree, "generate.py", "09_capstone_tree"),
             (tree.walk, "dflash/tree.py", "09_capstone_tree")]
# Lines of the answers the notebooks run by hand, one step at a time, to teach it (notebooks 2, 3
# and 7): what the copy may show. The loop around them is what it may not.
TAUGHT = {"features = runner.commit(accepted + 1)", "last = target_tokens[accepted]",
          "features = runner.commit_path(path)", "path = walk(tree, target_tokens)",
          "logprobs, candidates = runner.draft_tree(features, last)",
          "committed = [target_tokens[node] for node in path]"}


def tool():
    spec = importlib.util.spec_from_file_location("student_copy", TUTORIALS / "student_copy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("copy") / "course"
    tool().write_whole(out)
    return out


def code_of(line: str) -> str:
    return line.split("#")[0].strip()


def answer_lines(function, copied: Path) -> set[str]:
    """The lines of `function`'s body that say how it works: its statements' first lines
    (docstring out), those long enough to say something, that the rest of its file in the copy
    does not hold too (the plain loop's bookkeeping) and no notebook teaches (TAUGHT). Found here
    from the live function, not by the code under test."""
    source = inspect.getsource(function)
    lines = source.split("\n")
    starts = {node.lineno for statement in ast.parse(source).body[0].body[1:]
              for node in ast.walk(statement) if isinstance(node, ast.stmt)}  # a statement's first
    elsewhere = {code_of(line) for line in copied.read_text().split("\n")}
    found = {code_of(lines[start - 1]) for start in starts}
    return {line for line in found if len(line) >= 20} - elsewhere - TAUGHT


def visible_text(path: Path) -> str:
    """What a file shows a reader: a notebook's sources and outputs, any other file's text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    shown = []
    for cell in json.loads(text)["cells"]:
        shown.append("".join(cell["source"]))
        for output in cell.get("outputs", []):
            shown.append("".join(output.get("text", "")))
            shown.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(shown)


def test_the_copy_holds_no_capstone_answer_in_code_outputs_or_compiled_files(course):
    lines = {function.__name__: answer_lines(function, course / where)
             for function, where, _ in CAPSTONES}
    assert all(len(found) >= 3 for found in lines.values()), lines  # the search has teeth
    files = [path for path in course.rglob("*") if path.is_file()]
    assert not [path for path in course.rglob("*") if path.name == "__pycache__"
                or path.suffix in (".pyc", ".pyo")]
    for path in files:
        if path.suffix in (".pt", ".safetensors", ".bin", ".npy", ".png", ".jsonl"):
            continue
        shown = visible_text(path)
        for name, found in lines.items():
            held = [line for line in found if line in shown]
            assert not held, f"{path.relative_to(course)} shows {name}'s answer: {held}"


def test_the_notebook_cell_that_prints_the_loop_is_cut_in_the_copy(course):
    """Notebook 5 prints generate_dflash's loop from its source: in the copy, not its output."""
    cells = json.loads((course / "tutorials" / "05_fast_generation.ipynb").read_text())["cells"]
    printing = [cell for cell in cells if "getsource(generate_dflash)" in "".join(cell["source"])]
    assert printing and all(len(cell["outputs"]) == 1 for cell in printing)
    assert all(cell["outputs"][0]["text"][0].startswith("(cut from the student copy")
               for cell in printing)
    others = [cell for cell in cells if cell["cell_type"] == "code" and cell not in printing]
    assert any(cell["outputs"] for cell in others), "the other cells keep what they printed"


def test_the_stubs_keep_every_other_byte_and_name_the_starter(course):
    """In the copy each capstone function keeps its name, decorators and signature, and raises
    naming its lab's starter; every other top-level statement of its file is the original's."""
    for function, where, lab in CAPSTONES:
        original, copied = (ROOT / where).read_text(), (course / where).read_text()
        assert f"write it in tutorials/labs/{lab}/starter.py" in copied
        before, after = ast.parse(original).body, ast.parse(copied).body
        assert len(before) == len(after)
        for old, new in zip(before, after):
            old_text, new_text = (ast.get_source_segment(original, old),
                                  ast.get_source_segment(copied, new))
            if getattr(old, "name", None) in {f.__name__ for f, w, _ in CAPSTONES if w == where}:
                header = old_text.split('"""')[0]
                assert new_text.startswith(header) and new.body[-1].__class__ is ast.Raise
            else:
                assert old_text == new_text


def test_the_copy_imports_and_runs_what_is_not_the_capstone(course):
    """In the copy: the project imports, the plain loop runs on the demo pair, and the stubs say
    where the student's version goes."""
    script = """
import generate
from dflash import tree
from dflash.qwen3 import Qwen3
target = Qwen3.from_pretrained('weights/tiny-qwen3')
print(len(generate.generate_autoregressive(target, [1, 2, 3], 4).new_ids))
for call in (lambda: generate.generate_dflash(target, None, [1], 4),
             lambda: generate.generate_dflash_tree(target, None, [1], 4, budget=2),
             lambda: tree.walk(None, [])):
    try:
        call()
    except NotImplementedError as stub:
        print(stub)
"""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=course, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "4" and len(lines) == 4, lines
    for line, lab in zip(lines[1:], ["09_capstone", "09_capstone_tree", "09_capstone_tree"]):
        assert line.endswith(f"write it in tutorials/labs/{lab}/starter.py"), line


# Labs whose graders run the project's loop (generate_dflash, generate_dflash_tree), which the copy
# stubs, and so fail there on the stub's line even once written. None since issue #48: the graders
# get a DFlash run through tutorials/labs/_lab_helpers.py's run_dflash (in the copy, a replay off
# the plain loop's text), check plug-ins with the plain loop or the tree's verify pass, and grade
# the capstones by what the runner returned to the student's own loop. A lab that needs the loop
# again joins these sets, and the two tests below say so.
GRADED_WITH_THE_LOOP: set[str] = set()  # unwritten, they reach the stub before the starter
RUN_THE_LOOP: set[str] = GRADED_WITH_THE_LOOP | set()  # and those that reach it once written


def test_every_lab_in_the_copy_fails_until_written(course):
    """`python -m pytest tutorials/labs` in the copy, as a student's first run: every lab fails,
    each with one line naming its own starter, or, where its grader needs the project's loop, the
    stub's line naming the capstone's starter: never another error."""
    folders = sorted(path.name for path in (course / "tutorials" / "labs").iterdir()
                     if path.is_dir() and path.name[:2].isdigit())
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("DFLASH_LABS", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tutorials/labs"],
        cwd=course, env=environment, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    said = dict(re.findall(r"(\d\d_[a-z_]+): \S+ is not written yet - "
                           r"edit tutorials/labs/(\d\d_[a-z_]+)/starter\.py", output))
    assert done.returncode == 1 and f"{len(folders)} failed in" in output, output[-3000:]
    assert "passed" not in output, output[-3000:]
    assert said == {lab: lab for lab in folders if lab not in GRADED_WITH_THE_LOOP}, output[-3000:]
    sections = re.split(r"^_{3,} (test_[a-z_]+) _{3,}$", output, flags=re.M)
    stubbed = {name[len("test_"):] for name, report in zip(sections[1::2], sections[2::2])
               if "NotImplementedError: generate_dflash" in report}
    assert stubbed == {lab[3:] for lab in GRADED_WITH_THE_LOOP}, output[-3000:]


def test_the_answers_written_in_the_copy_pass_but_where_a_grader_runs_the_stubbed_loop(course,
                                                                                   tmp_path):
    """Each lab's reference answer, written into a copy's starter, passes there, except the labs
    whose graders need the project's loop (RUN_THE_LOOP): they fail on the stub's line. When a
    grader stops needing it, this fails until RUN_THE_LOOP drops it."""
    written = tmp_path / "course"
    shutil.copytree(course, written)
    for lab in LABS.iterdir():
        if lab.is_dir() and (lab / "solution.py").is_file():
            starter = written / "tutorials" / "labs" / lab.name / "starter.py"
            shutil.copyfile(lab / "solution.py", starter)
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("DFLASH_LABS", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tutorials/labs"],
        cwd=written, env=environment, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    sections = re.split(r"^_{3,} (test_[a-z_]+) _{3,}$", output, flags=re.M)
    failed = {name[len("test_"):] for name in sections[1::2]}
    stubbed = {name[len("test_"):] for name, report in zip(sections[1::2], sections[2::2])
               if "NotImplementedError: generate_dflash" in report}
    assert failed == stubbed == {lab[3:] for lab in RUN_THE_LOOP}, output[-3000:]
    labs = len([lab for lab in LABS.iterdir() if (lab / "solution.py").is_file()])
    assert f"{labs - len(RUN_THE_LOOP)} passed" in output, output[-3000:]


def test_the_copy_has_no_reference_answer_and_names_none(course):
    files = [path for path in course.rglob("*") if path.is_file()]
    assert not [path for path in files if path.name in ("solution.py", "INSTRUCTOR_KEY.md")]
    assert (course / "tutorials" / "labs" / "01_rmsnorm" / "starter.py").is_file()
    assert len(list((course / "tutorials").glob("0*.ipynb"))) == len(
        list(TUTORIALS.glob("0*.ipynb")))
    naming = [path for path in files
              if path.suffix in (".py", ".md", ".ipynb", ".txt", ".toml", "")
              and re.search(r"solution\.py|INSTRUCTOR_KEY",
                            path.read_text(encoding="utf-8", errors="replace"))]
    assert not naming, f"files in the student copy that name an answer: {naming}"


# ------------------------------------------------------------------ what the command copies


def small_repository(folder: Path) -> Path:
    """A repository with the capstones' files and a lab, a solution and a compiled one in it."""
    for where in ("generate.py", "dflash/tree.py", "tutorials/labs/09_capstone/starter.py",
                  "tutorials/labs/09_capstone/solution.py"):
        (folder / where).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / where, folder / where)
    cache = folder / "tutorials" / "labs" / "09_capstone" / "__pycache__"
    cache.mkdir()
    (cache / "solution.cpython-312.pyc").write_bytes(b"compiled answer")
    (folder / "stray.pyc").write_bytes(b"compiled")
    return folder


def git(folder: Path, *words: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *words], cwd=folder,
                   check=True, capture_output=True)


def outcome(main, argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    status = main(argv)
    return status, capsys.readouterr().err.strip().splitlines()


def test_a_copy_without_git_takes_no_compiled_file_and_says_it_cannot_tell(tmp_path, capsys):
    root = small_repository(tmp_path / "repo")
    status, said = outcome(lambda argv: tool().main(argv, root=root), [str(tmp_path / "out")],
                           capsys)
    assert status == 0 and len(said) == 1 and said[0].startswith("note: not a git checkout"), said
    copied = sorted(path.relative_to(tmp_path / "out").as_posix()
                    for path in (tmp_path / "out").rglob("*") if path.is_file())
    assert copied == ["dflash/tree.py", "generate.py", "tutorials/labs/09_capstone/starter.py"]
    assert "raise NotImplementedError" in (tmp_path / "out" / "generate.py").read_text()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_a_tree_with_uncommitted_tutorials_is_refused(change, tmp_path, capsys):
    root = small_repository(tmp_path / "repo")
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "add", "-f", "stray.pyc")  # tracked, and still never copied
    git(root, "commit", "-q", "-m", "course")
    starter = root / "tutorials" / "labs" / "09_capstone" / "starter.py"
    if change == "untracked":
        (starter.parent / "notes.py").write_text("mine\n")
    else:
        starter.write_text(starter.read_text() + "# an edit\n")
        if change == "staged":
            git(root, "add", str(starter))
    out = tmp_path / "out"
    status, said = outcome(lambda argv: tool().main(argv, root=root), [str(out)], capsys)
    assert status == 2 and len(said) == 1 and said[0].startswith("error: tutorials/ has 1 "), said
    assert "tutorials/labs/09_capstone/" in said[0] and not out.exists()
    git(root, "add", "-A")  # once committed, the copy is made
    git(root, "commit", "-q", "-m", "all")
    status, said = outcome(lambda argv: tool().main(argv, root=root), [str(out)], capsys)
    assert status == 0 and said == []
    assert not list(out.rglob("*.pyc")) and not (out / "tutorials/labs/09_capstone/solution.py"
                                                   ).exists()


def test_a_capstone_answer_that_moved_is_refused(tmp_path, capsys):
    """Should the project's loop be renamed, the copy refuses rather than hand it out."""
    root = small_repository(tmp_path / "repo")
    source = root / "generate.py"
    source.write_text(source.read_text().replace("def generate_dflash(", "def speculate("))
    status, said = outcome(lambda argv: tool().main(argv, root=root), [str(tmp_path / "out")],
                           capsys)
    assert status == 2 and said[-1].startswith("error: generate.py has no function "
                                               "generate_dflash"), said
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["repo"]


def test_a_stub_keeps_the_signature_and_decorators_whatever_they_are():
    student_copy = tool()
    source = ('import torch\n\n\n@torch.no_grad()\n@other(\n    1)\n'
              'def generate_dflash(a,\n                    b=(1,\n  2), *, c: "int" = 3\n'
              '                    ) -> list:\n    x = 1  # how\n    return [a, b, x]\n\n\n'
              'def walk_on():\n    return 2\n')
    for name, lab in (("generate_dflash", "09_capstone"),):
        student_copy.CAPSTONE_ANSWERS["x.py"] = {name: lab}
        stubbed = student_copy.without_answers(source, "x.py")
        head = source.split("    x = 1")[0]
        assert stubbed.startswith(head) and stubbed.endswith("\n\n\ndef walk_on():\n    return 2\n")
        assert "x = 1" not in stubbed and f"tutorials/labs/{lab}/starter.py" in stubbed
    student_copy.CAPSTONE_ANSWERS["x.py"] = {"f": "09_capstone"}
    with pytest.raises(student_copy.CannotCopy, match="its own"):
        student_copy.without_answers("def f(): return 1\n", "x.py")


def test_check_setup_in_the_copy_says_the_loop_is_the_students_to_write(course):
    """The setup check runs in the copy, its DFlash loop a stub: the plain loop is checked, and
    the lab graded is the unwritten starter."""
    environment = dict(os.environ, PYTHONPATH=str(course))  # as after pip install -e . there
    done = subprocess.run([sys.executable, "tutorials/check_setup.py"], cwd=course,
                          env=environment, capture_output=True, text=True, timeout=600)
    lines = {line[6:].split(":")[0]: line for line in done.stdout.splitlines()}
    assert done.stderr == "", done.stderr[-2000:]
    assert lines["demo pair"].startswith("ok    ") and "yours to write (lab 09_capstone)" in \
        lines["demo pair"], done.stdout
    assert lines["one lab"].startswith("ok    one lab: lab 01_rmsnorm's grader runs, and fails"), \
        done.stdout
