"""tutorials/check_setup.py reports every missing piece in one line with its fix, and never raises.

Each piece is removed the way a student's machine lacks it: a package hidden from the import
system (`sys.modules[name] = None`, so `import name` fails and find_spec finds nothing) in a
fresh interpreter, the weights replaced by the Git LFS pointers a clone without git-lfs gets.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK_SETUP = ROOT / "tutorials" / "check_setup.py"
# check_setup.py's main() in a fresh interpreter: argv[1] the modules to hide, argv[2] a
# repository root to check (or "" for this one).
RUN = """
import importlib.util, sys
from pathlib import Path
for name in filter(None, sys.argv[1].split(",")):
    sys.modules[name] = None  # `import name` raises ImportError, as if it were not installed
spec = importlib.util.spec_from_file_location("check_setup", sys.argv[3])
check_setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_setup)
if sys.argv[2]:
    check_setup.ROOT = Path(sys.argv[2])
sys.exit(check_setup.main([]))
"""
POINTER = ("version https://git-lfs.github.com/spec/v1\n"
           "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
           "size 9983808\n")


def load():
    spec = importlib.util.spec_from_file_location("check_setup", CHECK_SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(hidden=(), root: Path | None = None) -> dict[str, str]:
    """check_setup's lines, by check, with `hidden` modules missing; it must exit 1 (something
    failed) with nothing on standard error (no traceback), one line per check, and a summary."""
    done = subprocess.run(
        [sys.executable, "-c", RUN, ",".join(hidden), str(root or ""), str(CHECK_SETUP)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stderr == "", done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].endswith("check(s) failed: fix them, then run this again"), lines
    checks = {line[6:].split(":")[0]: line for line in lines[:-1]}
    assert list(checks) == list(load().CHECKS), lines
    assert all(line[:6] in ("ok    ", "FAIL  ", "skip  ") for line in lines[:-1]), lines
    return checks


def lfs_weights(folder: Path) -> Path:
    """A repository root whose demo pair's weights are Git LFS pointers."""
    for name in ("tiny-qwen3", "tiny-qwen3-dflash"):
        shutil.copytree(ROOT / "weights" / name, folder / "weights" / name)
        (folder / "weights" / name / "model.safetensors").write_text(POINTER)
    return folder


@pytest.mark.parametrize("piece, check, fix", [
    ("torch", "torch", "pip install torch"),
    ("tokenizers", "packages", "pip install -e ."),
    ("safetensors", "packages", "pip install -e ."),
    ("jupyterlab", "jupyter", 'pip install -e ".[test]" jupyterlab'),
    ("pytest", "pytest", 'pip install -e ".[test]" jupyterlab'),
])
def test_a_missing_package_is_one_line_with_its_fix(piece, check, fix):
    checks = run([piece])
    assert checks[check].startswith(f"FAIL  {check}: ") and piece in checks[check], checks
    assert fix in checks[check], checks[check]
    if check in ("torch", "packages"):
        assert checks["demo pair"].startswith("skip  demo pair: needs")
        assert checks["one lab"].startswith("skip  one lab: needs")
    if check == "pytest":
        assert checks["one lab"] == "skip  one lab: needs pytest, which failed above"


def test_weights_that_are_lfs_pointers_are_named_with_the_fix(tmp_path):
    checks = run(root=lfs_weights(tmp_path))
    assert checks["weights"].startswith("FAIL  weights: weights/tiny-qwen3/model.safetensors, ")
    assert "Git LFS pointers" in checks["weights"] and "git lfs pull" in checks["weights"]
    assert checks["demo pair"] == "skip  demo pair: needs weights, which failed above"


def test_every_piece_missing_at_once_is_every_line_and_no_error(tmp_path):
    checks = run(["torch", "tokenizers", "jupyterlab", "pytest"], lfs_weights(tmp_path))
    assert [line[:4] for line in checks.values()] == [
        "FAIL", "FAIL", "FAIL", "FAIL", "FAIL", "skip", "skip"], checks


def test_a_lab_that_fails_is_one_line_not_pytests_output(monkeypatch):
    """pytest's 2 KB of output when the lab does not run become one line: its first error."""
    check_setup = load()
    noise = "".join(f"line {i} of a long report\n" for i in range(100))
    said = noise + "E   ModuleNotFoundError: No module named 'dflash'\n" + noise
    monkeypatch.setattr(check_setup.subprocess, "run", lambda *args, **options:
                        subprocess.CompletedProcess(args, 2, said, ""))
    failed = set()
    line = check_setup.outcome("one lab", failed)
    assert line.startswith("FAIL  one lab: lab 01_rmsnorm") and "\n" not in line, line
    assert line.endswith("E   ModuleNotFoundError: No module named 'dflash'") and len(line) < 300
    assert failed == {"one lab"}


def test_an_unexpected_error_inside_a_check_is_a_line_not_a_traceback(monkeypatch):
    check_setup = load()

    def broken():
        raise RuntimeError("a half-installed package\nwith more lines")

    monkeypatch.setitem(check_setup.CHECKS, "weights", broken)
    failed = set()
    line = check_setup.outcome("weights", failed)
    assert line.startswith("FAIL  weights: RuntimeError: a half-installed package (reinstall")
    assert check_setup.outcome("demo pair", failed).startswith("skip  demo pair: needs weights")


def test_on_this_checkout_every_check_passes_but_a_missing_jupyter():
    """All pass here, except Jupyter Lab where it is not installed (the test extra does not
    install it; the syllabus's setup does), which must then fail naming the command that does."""
    check_setup = load()
    for name, check in check_setup.CHECKS.items():
        if name == "jupyter" and check_setup.missing("jupyterlab"):
            with pytest.raises(check_setup.CheckFailed, match="pip install -e .* jupyterlab"):
                check()
        else:
            assert check()
