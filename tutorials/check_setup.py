"""Is this machine ready for the course? Run it once after the syllabus's setup:

    python tutorials/check_setup.py

It checks, in order: the torch build (its version, and the attention call the project needs), the
project's other packages (numpy, tokenizers, safetensors, tqdm), Jupyter (what `jupyter lab
tutorials/` needs), pytest (what grades the labs), that the demo pair's weights are the weights
(not Git LFS pointers), that the pair loads and writes the plain loop's tokens with DFlash, and
that one lab's grader runs: against its reference answer where there is one (the instructor's
copy), else against its starter, which must fail saying what to write (a student's copy). Each
check prints one line, with the fix when it fails; a check that needs a failed one says so and is
skipped. It never stops on an error of its own: the exit status is 0 when all pass, 1 if any
fails.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the lab graded here: a starter that fails in a second, a grader that runs the demo pair
LAB = "01_rmsnorm"
MINIMUM_TORCH = (2, 5)  # enable_gqa in scaled_dot_product_attention, FlexAttention
PAIR = ("tiny-qwen3", "tiny-qwen3-dflash")  # under weights/
INSTALL = 'pip install -e ".[test]" jupyterlab (the syllabus\'s setup, in the repository)'
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


class CheckFailed(Exception):
    """A check's one-line reason, and what to do about it."""


def missing(*names: str) -> list[str]:
    """The modules among `names` that cannot be imported (not installed, or hidden)."""
    absent = []
    for name in names:
        try:
            if sys.modules.get(name, ...) is None or importlib.util.find_spec(name) is None:
                absent.append(name)
        except (ImportError, ValueError):  # a broken install's package
            absent.append(name)
    return absent


def check_torch() -> str:
    if missing("torch"):
        raise CheckFailed("torch is not installed: pip install torch (the README says which "
                          "build), then pip install -e . in the repository")
    import torch
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MINIMUM_TORCH:
        raise CheckFailed(
            f"torch {torch.__version__} is too old: the project needs "
            f"{'.'.join(map(str, MINIMUM_TORCH))} or newer: pip install -U torch"
        )
    q = torch.randn(1, 4, 3, 8)  # (batch, heads, seq, head_dim)
    k = v = torch.randn(1, 2, 3, 8)  # two key/value heads for four query heads
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    build = (
        f"CUDA {torch.version.cuda}, a GPU {'found' if torch.cuda.is_available() else 'not found'}"
        if torch.version.cuda
        else "a CPU build"
    )
    return f"torch {torch.__version__} ({build})"


def check_packages() -> str:
    absent = missing("numpy", "tokenizers", "safetensors", "tqdm", "dflash")
    if absent:
        raise CheckFailed(f"missing {', '.join(absent)}: pip install -e . in the repository")
    return "numpy, tokenizers, safetensors, tqdm and the project itself are installed"


def check_jupyter() -> str:
    absent = missing("jupyterlab", "ipykernel", "nbclient", "matplotlib")
    if absent:
        raise CheckFailed(f"missing {', '.join(absent)}: {INSTALL}")
    return "Jupyter Lab, its Python kernel, the notebook runner and matplotlib are installed"


def check_pytest() -> str:
    if missing("pytest"):
        raise CheckFailed(f"pytest is not installed, and it grades the labs: {INSTALL}")
    return "pytest, which grades the labs, is installed"


def lfs_pointers(folder: Path) -> list[Path]:
    """The files under `folder` that are Git LFS pointers (a small text naming the file), not
    the file: what a clone without git-lfs gets."""
    pointers = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.stat().st_size < 1024:
            with open(path, "rb") as file:
                if file.read(len(LFS_POINTER)) == LFS_POINTER:
                    pointers.append(path)
    return pointers


def check_weights() -> str:
    weights = ROOT / "weights"
    absent = [name for name in PAIR if not (weights / name / "model.safetensors").is_file()]
    if absent:
        raise CheckFailed(f"no {', '.join(absent)} in {weights}: run from a whole copy of the "
                          f"repository")
    pointers = lfs_pointers(weights)
    if pointers:
        named = ", ".join(str(path.relative_to(ROOT)) for path in pointers[:2])
        more = f" and {len(pointers) - 2} more" if len(pointers) > 2 else ""
        raise CheckFailed(f"{named}{more} are Git LFS pointers, not the weights: install git-lfs, "
                          f"then git lfs install && git lfs pull in the repository")
    return f"the demo pair's files are in {weights.relative_to(ROOT)}/"


def check_demo_pair() -> str:
    # Imported here, not at the top: this program's job is to say what is missing, so an import
    # that fails is a finding, not a crash.
    import torch

    from dflash.drafter import Drafter
    from dflash.qwen3 import Qwen3
    from dflash.tokenizer import load_tokenizer
    from generate import generate_autoregressive, generate_dflash

    weights = ROOT / "weights"
    torch.set_num_threads(1)
    began = time.perf_counter()
    target = Qwen3.from_pretrained(weights / PAIR[0])
    drafter = Drafter.from_pretrained(weights / PAIR[1], target=target)
    tokenizer = load_tokenizer(weights / PAIR[0])
    ids = tokenizer.encode_chat([{
        "role": "user",
        "content": "Mia has 14 apples. She buys 9 more. How many apples are there now?",
    }])
    plain = generate_autoregressive(target, ids, 24, stop_ids=tokenizer.stop_token_ids).new_ids
    try:
        dflash = generate_dflash(target, drafter, ids, 24, stop_ids=tokenizer.stop_token_ids)
    except NotImplementedError:  # the student copy: the loop is the capstone's, yet to write
        return (f"the demo pair loads and the plain loop writes {len(plain)} tokens; the DFlash "
                f"loop is yours to write (lab 09_capstone)")
    if dflash.new_ids != plain:
        raise CheckFailed(
            "the demo pair's DFlash loop wrote other tokens than the plain loop: a broken install? "
            "pip install -e . again"
        )
    return (
        f"the demo pair loads, and DFlash writes the plain loop's {len(plain)} tokens "
        f"(tau {dflash.mean_acceptance:.2f}; {time.perf_counter() - began:.1f} s)"
    )


def last_words(output: str) -> str:
    """The line of pytest's output that says most, in at most 200 characters: its first error,
    else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("E ")), lines[-1] if lines else "")
    return said if len(said) <= 200 else said[:197] + "..."


def check_one_lab() -> str:
    folder = ROOT / "tutorials" / "labs" / LAB
    if not (folder / "starter.py").is_file():
        raise CheckFailed(f"no lab {LAB} in {folder.parent}: run from a whole copy of the "
                          f"repository")
    answered = any(path.stem == "solution" for path in folder.glob("*.py"))  # the instructor's
    environment = (
        dict(os.environ, DFLASH_LABS="solutions")
        if answered
        else {name: value for name, value in os.environ.items() if name != "DFLASH_LABS"}
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tutorials/labs",
               "-k", LAB.split("_", 1)[1]]
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=600)
    output = done.stdout + done.stderr
    if answered:
        if done.returncode != 0 or "1 passed" not in output:
            raise CheckFailed(f"lab {LAB} fails against its reference answer: "
                              f"{last_words(output)}")
        return f"lab {LAB}'s grader passes its reference answer"
    if done.returncode != 1 or f"{LAB}: my_rms_norm is not written yet" not in output:
        raise CheckFailed(f"lab {LAB}'s grader did not run as a student's first run should: "
                          f"{last_words(output)}")
    return f"lab {LAB}'s grader runs, and fails the unwritten starter saying what to write"


CHECKS = {
    "torch": check_torch,
    "packages": check_packages,
    "jupyter": check_jupyter,
    "pytest": check_pytest,
    "weights": check_weights,
    "demo pair": check_demo_pair,
    "one lab": check_one_lab,
}
# What a check cannot run without: when one of these failed, it is skipped, saying so.
NEEDS = {
    "demo pair": ["torch", "packages", "weights"],
    "one lab": ["torch", "packages", "pytest", "weights"],
}


def outcome(name: str, failed: set[str]) -> str:
    """The check's one line: ok, FAIL (with the fix), or skip (naming what failed first). Any
    error of the check's own is a FAIL too, named: this program reports, it does not crash."""
    blocked = [need for need in NEEDS.get(name, []) if need in failed]
    if blocked:
        failed.add(name)
        return f"skip  {name}: needs {' and '.join(blocked)}, which failed above"
    try:
        return f"ok    {name}: {CHECKS[name]()}"
    except CheckFailed as error:
        reason = str(error)
    except subprocess.TimeoutExpired:
        reason = "took over 10 minutes: a machine this slow cannot follow the course"
    except Exception as error:  # noqa: BLE001: a finding to report, whatever it is
        reason = (f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                  f" (reinstall: {INSTALL})")
    failed.add(name)
    return f"FAIL  {name}: {reason}"


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad command line is one `error:` line and exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """Every check in turn; the command line takes no option but --help (anything else is a typo
    to say, not to ignore)."""
    parser = OneLineErrors(description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    try:
        parser.parse_args(argv)
    except SystemExit as exit:  # a bad command line (2), or --help (0)
        return exit.code
    failed: set[str] = set()
    try:
        for name in CHECKS:
            print(outcome(name, failed), flush=True)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    print(
        "ready for the course"
        if not failed
        else f"{len(failed)} check(s) failed: fix them, then run this again"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
