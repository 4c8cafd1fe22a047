"""Does the demo keep its speed beside a busy neighbour? generate.py as a newcomer runs it, quiet
and with cores kept busy by other processes.

    python benchmarks/busy_neighbour.py
    python benchmarks/busy_neighbour.py --busy 1 --runs 7 --also-threads 2 \\
        --json docs/results/busy_neighbour.json

Runs `python generate.py --prompt P --compare --json` (its default threads and dtype: what a
newcomer types) --runs times on the machine as it is, then as many times with --busy processes
each spinning on a core (a plain Python loop, what a neighbour's job is to the scheduler), and
reports the plain loop's and DFlash's tokens/s (the median over runs, wall time: what the user
waits for) and busy over quiet. --also-threads repeats both with `--threads N` for contrast, e.g.
every core, the old default, which a busy neighbour collapses: OpenMP's threads wait for each
other at every operator, and one of them waits for the neighbour's time slice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from cpu_study import cpu_description, load_average
from bench_common import check_report_output, write_report
from dflash.cli import (OneLineErrors, checked, default_threads,
                        positive_int, run_cli)

ROOT = Path(__file__).resolve().parents[1]

PROMPT = ("Leo buys 3 pens that cost 4 dollars each. He pays with 20 dollars. How much change does "
          "Leo get?")  # generate.py's own example


@contextmanager
def busy_cores(count: int):
    """`count` processes, each spinning on a core until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def newcomer_run(prompt: str, threads: int | None, max_new_tokens: int) -> dict:
    """One `generate.py --compare --json` in a fresh process, its environment the user's own
    (OMP_NUM_THREADS removed: generate.py picks its threads as it would for a newcomer)."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    command = [sys.executable, str(ROOT / "generate.py"), "--prompt", prompt, "--compare",
               "--json", "--max-new-tokens", str(max_new_tokens)]
    if threads is not None:
        command += ["--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(done.stdout)


def measure(prompt: str, threads: int | None, runs: int, max_new_tokens: int) -> dict:
    """The median tokens/s of the plain loop and of DFlash over `runs` runs, and every run's."""
    reports = [newcomer_run(prompt, threads, max_new_tokens) for _ in range(runs)]
    plain = [r["baseline_tokens_per_second"] for r in reports]
    dflash = [r["tokens_per_second"] for r in reports]
    return {"plain_tokens_per_s": statistics.median(plain),
            "dflash_tokens_per_s": statistics.median(dflash), "plain_runs": plain,
            "dflash_runs": dflash, "same_output": all(r["output_ids"] == r["baseline_output_ids"]
                                                      for r in reports),
            "load_average_after": load_average()}


def compare(args, threads: int | None) -> dict:
    """Quiet, then busy, at one thread setting; busy over quiet for both loops."""
    quiet = measure(args.prompt, threads, args.runs, args.max_new_tokens)
    with busy_cores(args.busy):
        busy = measure(args.prompt, threads, args.runs, args.max_new_tokens)
    kept = {loop: busy[f"{loop}_tokens_per_s"] / quiet[f"{loop}_tokens_per_s"]
            for loop in ("plain", "dflash")}
    return {"threads": threads or f"default ({default_threads()})", "quiet": quiet, "busy": busy,
            "busy_over_quiet": kept}


def run(args) -> int:
    demo = ROOT / "weights"  # generate.py's default pair, which every run reads
    check_report_output(args.json, "--json", {"the demo pair": demo / "tiny-qwen3",
                                              "its drafter": demo / "tiny-qwen3-dflash"})
    settings = [None, *args.also_threads]
    report = {"conditions": {"cpu": cpu_description(), "busy_processes": args.busy,
                             "runs": args.runs, "prompt": args.prompt,
                             "max_new_tokens": args.max_new_tokens,
                             "load_average_at_start": load_average()},
              "rows": [compare(args, threads) for threads in settings]}
    print(f"{args.busy} core(s) kept busy; median of {args.runs} runs of generate.py --compare "
          f"(wall tokens/s)\n")
    print("| threads | plain quiet | plain busy | kept | DFlash quiet | DFlash busy | kept |")
    print("|---|---|---|---|---|---|---|")
    for row in report["rows"]:
        quiet, busy, kept = row["quiet"], row["busy"], row["busy_over_quiet"]
        print(f"| {row['threads']} | {quiet['plain_tokens_per_s']:.0f} | "
              f"{busy['plain_tokens_per_s']:.0f} | {kept['plain']:.2f}x | "
              f"{quiet['dflash_tokens_per_s']:.0f} | {busy['dflash_tokens_per_s']:.0f} | "
              f"{kept['dflash']:.2f}x |")
    if args.json:
        write_report(args.json, report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default=PROMPT, help="the prompt (default: generate.py's example)")
    p.add_argument("--busy", type=checked(int, "0 or more", lambda x: x >= 0), default=1,
                   help="processes kept spinning, one core each (default 1)")
    p.add_argument("--runs", type=positive_int, default=5, help="runs per setting (median kept)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--also-threads", type=positive_int, nargs="*", default=[], metavar="N",
                   help="also run with generate.py --threads N, e.g. every core")
    p.add_argument("--json", type=Path, help="also write the report to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
