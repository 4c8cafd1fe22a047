"""Does `--block-size auto` pick a block as fast as the best fixed one? A sweep, measured.

    python benchmarks/block_sweep.py                                   # the demo pair, eager
    python benchmarks/block_sweep.py --compile --json docs/results/block_sweep_compiled.json
    python benchmarks/block_sweep.py --blocks 4,8,12,16 --rounds 2 \
        --prompts weights/handwritten_problems.jsonl

Greedy DFlash runs on every prompt of the set at each fixed block (2..the drafter's, or --blocks)
and at the block `--block-size auto` picks (generate.py's choice: the calibrated pass costs and the
drafter's acceptance, dflash/block_choice.py), in turns prompt by prompt, --rounds times; a
block's time is the sum over prompts of each prompt's least time over the rounds (a busy
machine's noise only adds time), its speed the tokens of all prompts over that time. The report:
each block's tokens/s and tau, the pick's prediction, and the pick's measured speed as a share of
the fastest block's. With one thread, times are the process's CPU
time (a neighbour's share of the cores does not count); with more, wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

import generate
from cpu_study import cpu_description, listed
from dflash.block_choice import choose_block
from bench_common import write_report
from dflash.cli import OneLineErrors, UsageError, checked, run_cli
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from sweep_common import add_sweep_options, load_sweep


def sweep(target: Qwen3, drafter: Drafter, prompts: list[list[int]], stops: list[int],
          blocks: Sequence[int], args, clock) -> dict[int, dict]:
    """Each block's tokens/s over all prompts: every prompt's least time over the rounds, summed.
    The blocks take turns prompt by prompt, so a busy spell slows one prompt's run of one block,
    and another round's run of it replaces that one."""
    longest = max(map(len, prompts)) + args.max_new_tokens + 2 * max(blocks)
    runners = {n: generate.ModelRunner(target, drafter, block_size=n, max_length=longest,
                                       compile=args.compile) for n in blocks}

    def run_one(n: int, ids: list[int]):
        return generate.generate_dflash(target, drafter, ids, args.max_new_tokens, stop_ids=stops,
                                        runner=runners[n])

    for n in blocks:  # unmeasured: allocations, kernels, compiling every bucket the runs read
        for ids in prompts:
            run_one(n, ids)
    best = {n: [float("inf")] * len(prompts) for n in blocks}
    results = {n: [None] * len(prompts) for n in blocks}
    for _ in range(args.rounds):
        for i, ids in enumerate(prompts):
            for n in blocks:  # in turns
                began = clock()
                results[n][i] = run_one(n, ids)
                best[n][i] = min(best[n][i], clock() - began)
    figures = {}
    for n in blocks:
        tokens = sum(r.new_tokens for r in results[n])
        steps = sum(r.steps for r in results[n])
        seconds = sum(best[n])
        figures[n] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                      "tau": sum(sum(r.acceptance_lengths) for r in results[n]) / steps}
    return figures


def run(args) -> int:
    device, target, drafter, prompts, stops = load_sweep(args)
    largest = drafter.config.block_size
    blocks = args.blocks or list(range(2, largest + 1))
    if max(blocks) > largest:
        raise UsageError(f"--blocks {max(blocks)} is past the drafter's block of {largest}")
    began = time.perf_counter()
    said = []
    auto = choose_block(generate.ModelRunner, target, drafter, args.draft, compile=args.compile,
                        first_steps=lambda: generate.generate_dflash(
                            target, drafter, prompts[0], 64, stop_ids=stops), say=said.append)
    why = said[0]
    print(f"{why} ({time.perf_counter() - began:.1f} s)", file=sys.stderr)
    clock = time.process_time if torch.get_num_threads() == 1 and device.type == "cpu" \
        else time.perf_counter
    figures = sweep(target, drafter, prompts, stops, sorted({*blocks, auto}), args, clock)
    fastest = max(figures, key=lambda n: figures[n]["tokens_per_s"])
    share = figures[auto]["tokens_per_s"] / figures[fastest]["tokens_per_s"]
    report = {"conditions": {"cpu": cpu_description(), "device": str(device),
                             "dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."),
                             "threads": torch.get_num_threads(), "compile": args.compile,
                             "clock": "cpu" if clock is time.process_time else "wall",
                             "torch": torch.__version__, "prompts": str(args.prompts),
                             "max_new_tokens": args.max_new_tokens, "rounds": args.rounds},
              "auto_block": auto, "auto_reason": why, "fastest_block": fastest,
              "auto_share_of_fastest": share, "blocks": figures}
    print("| block | tau | tokens/s | share of the fastest |\n|---|---|---|---|")
    for n, row in figures.items():
        mark = " (auto)" if n == auto else ""
        print(f"| {n}{mark} | {row['tau']:.2f} | {row['tokens_per_s']:.1f} | "
              f"{row['tokens_per_s'] / figures[fastest]['tokens_per_s']:.3f} |")
    print(f"auto picked {auto}: {100 * share:.1f} % of the fastest block's ({fastest}) tokens/s")
    if args.json:
        write_report(args.json, report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    block = checked(int, "at least 2", lambda x: x >= 2)
    p.add_argument("--blocks", type=listed(block, rule="comma-separated int, at least 2"),
                   help="the fixed blocks, e.g. 4,8,12,16 (default: 2..the drafter's)")
    add_sweep_options(p, "block")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
