"""Is this machine ready for the course? Run it once after the syllabus's setup:

    python tutorials/check_setup.py

It checks, in order: the torch build (its version, and the attention call the project needs),
Jupyter (what `jupyter lab tutorials/` needs), that the demo pair in weights/ loads and its DFlash
loop writes the plain loop's tokens, and that one lab's grader runs: against its reference answer
where there is one (the instructor's copy), else against its starter, which must fail saying what
to write (a student's copy). Each check prints one line; the exit status is 0 when all pass, 1 if
any fails.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the lab graded here: a starter that fails in a second, a grader that runs the demo pair
LAB = "01_rmsnorm"
MINIMUM_TORCH = (2, 5)  # enable_gqa in scaled_dot_product_attention, FlexAttention


class CheckFailed(Exception):
    """A check's one-line reason, and what to do about it."""


def check_torch() -> str:
    try:
        import torch
    except ImportError:
        raise CheckFailed("torch is not installed: pip install torch (see the README)") from None
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MINIMUM_TORCH:
        raise CheckFailed(
            f"torch {torch.__version__} is too old: the project needs "
            f"{'.'.join(map(str, MINIMUM_TORCH))} "
            f"or newer"
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


def check_jupyter() -> str:
    missing = [
        name
        for name in ("jupyterlab", "ipykernel", "nbclient", "matplotlib")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise CheckFailed(
            f"missing {', '.join(missing)}: run the syllabus's setup, "
            f'pip install -e ".[test]" jupyterlab'
        )
    return "Jupyter Lab, its Python kernel, the notebook runner and matplotlib are installed"


def check_demo_pair() -> str:
    # Imported here, not at the top: this program's job is to say what is missing, so an import
    # that fails is a finding, not a crash.
    import torch
    try:
        from dflash.drafter import Drafter
        from dflash.qwen3 import Qwen3
        from dflash.tokenizer import load_tokenizer
        from generate import generate_autoregressive, generate_dflash
    except ImportError as err:
        raise CheckFailed(f"the project is not installed ({err}): run pip install -e . "
                          f"in the repository") from None

    weights = ROOT / "weights"
    if not (weights / "tiny-qwen3").is_dir():
        raise CheckFailed(f"no demo pair in {weights}: run from a whole copy of the repository")
    torch.set_num_threads(1)
    began = time.perf_counter()
    target = Qwen3.from_pretrained(weights / "tiny-qwen3")
    drafter = Drafter.from_pretrained(weights / "tiny-qwen3-dflash", target=target)
    tokenizer = load_tokenizer(weights / "tiny-qwen3")
    ids = tokenizer.encode_chat(
        [
            {
                "role": "user",
                "content": "Mia has 14 apples. She buys 9 more. How many apples are there now?",
            }
        ]
    )
    plain = generate_autoregressive(target, ids, 24, stop_ids=tokenizer.stop_token_ids).new_ids
    dflash = generate_dflash(target, drafter, ids, 24, stop_ids=tokenizer.stop_token_ids)
    if dflash.new_ids != plain:
        raise CheckFailed(
            "the demo pair's DFlash loop wrote other tokens than the plain loop: a broken install?"
        )
    return (
        f"the demo pair loads, and DFlash writes the plain loop's {len(plain)} tokens "
        f"(tau {dflash.mean_acceptance:.2f}; {time.perf_counter() - began:.1f} s)"
    )


def check_one_lab() -> str:
    folder = ROOT / "tutorials" / "labs" / LAB
    answered = any(path.stem == "solution" for path in folder.glob("*.py"))  # the instructor's copy
    environment = (
        dict(os.environ, DFLASH_LABS="solutions")
        if answered
        else {name: value for name, value in os.environ.items() if name != "DFLASH_LABS"}
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tutorials/labs",
            "-k",
            LAB.split("_", 1)[1],
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    if answered:
        if done.returncode != 0 or "1 passed" not in output:
            raise CheckFailed(f"lab {LAB} fails against its reference answer:\n{output[-2000:]}")
        return f"lab {LAB}'s grader passes its reference answer"
    if done.returncode != 1 or f"{LAB}: my_rms_norm is not written yet" not in output:
        raise CheckFailed(
            f"lab {LAB}'s grader did not run as a student's first run should:\n{output[-2000:]}"
        )
    return f"lab {LAB}'s grader runs, and fails the unwritten starter saying what to write"


CHECKS = {
    "torch": check_torch,
    "jupyter": check_jupyter,
    "demo pair": check_demo_pair,
    "one lab": check_one_lab,
}


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
    failed = 0
    for name, check in CHECKS.items():
        try:
            print(f"ok    {name}: {check()}")
        except CheckFailed as error:
            print(f"FAIL  {name}: {error}")
            failed += 1
    print(
        "ready for the course"
        if not failed
        else f"{failed} check(s) failed: fix them, then run this again"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
