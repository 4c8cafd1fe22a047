"""What one pass costs for 1 to 16 tokens, eager and compiled: the cost model behind DFlash's speedup.

    python benchmarks/pass_costs.py                                  # the demo pair, eager and compiled, one thread
    python benchmarks/pass_costs.py --threads 2 --json docs/results/pass_costs_cpu.json

A speculative step replaces k decode passes by one draft and one verify of B tokens, so its speedup is at most
k * decode / (draft(B) + verify(B)). How a pass's time grows with its tokens decides that ratio: overhead-bound
passes (eager PyTorch: every operator pays the Python dispatcher; a GPU reading its weights) cost nearly the same
for 1 and 16 tokens, compute-bound ones (a compiled pass on a CPU core) grow with them. Each pass is timed
through the runner the loops use, at a fixed cache length, as the minimum over interleaved rounds (a shared
machine's noise only ever adds time), and the verify costs are fitted by least squares to overhead + n * per-token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

import generate
from bench_common import check_report_output, least_time, write_report
from dflash.cli import (OneLineErrors, UsageError, checked, positive, positive_int,
                        run_cli, thread_count)
from dflash.block_choice import fit_line, step_passes, steady_runner
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3


def runner_at(target: Qwen3, drafter: Drafter, tokens: int, context: int, compiled: bool,
              max_length: int | None = None, **options) -> generate.ModelRunner:
    """A runner for blocks of `tokens`, its caches filled with a `context`-token prompt and its first draft.
    `max_length`: its buffers' (default: the context and 64 slots), which a compiled pass's graph
    follows: a benchmark whose loops use the same length compiles each pass once for both.
    `options`: ModelRunner's others (a backend)."""
    length = max_length

    def runner_class(*args, max_length: int, **given):  # steady_runner's length, or ours
        return generate.ModelRunner(*args, **{**given, **options, "max_length": length or max_length})

    return steady_runner(runner_class, target, drafter, tokens, context, compiled)


def pass_calls(runner: generate.ModelRunner, tokens: int, context: int, label: str) -> dict[str, Callable]:
    """The verify and draft passes of a steady-state step (`step_passes`), named for `label`'s mode."""
    return {f"{label} {name}": call for name, call in step_passes(runner, tokens).items()}


@torch.no_grad()
def measure(args) -> dict:
    torch.manual_seed(0)
    target = Qwen3.from_pretrained(args.model)
    positions = target.config.max_position_embeddings
    if args.context + 64 > positions:  # the runners' caches: the context and a step's room
        raise UsageError(f"--context {args.context} is past the target's {positions - 64} "
                         f"(max_position_embeddings {positions}, less 64 for the steps)")
    drafter = Drafter.from_pretrained(args.draft, target=target)
    loops, largest = {}, max(args.tokens)  # loop -> its passes, by name
    for compiled in (False, True):
        label = "compiled" if compiled else "eager"
        plain = generate.ModelRunner(target, None, max_length=args.context + 64, compile=compiled)
        plain.prefill(torch.arange(2, args.context + 2), 0.0, None)
        loops[f"{label} plain"] = {f"{label} decode 1": lambda plain=plain: plain.decode(1, 0.0, None)}
        for tokens in args.tokens:
            runner = runner_at(target, drafter, tokens, args.context, compiled)
            loops[f"{label} block {tokens}"] = pass_calls(runner, tokens, args.context, label)
        print(f"[pass costs] {label} runners ready", file=sys.stderr)
    seconds = least_time(loops, args.rounds, args.repeats)
    report = {"conditions": {"model": str(args.model), "draft": str(args.draft), "context": args.context,
                             "threads": torch.get_num_threads(), "torch": torch.__version__,
                             "rounds": args.rounds, "repeats": args.repeats}, "modes": {}}
    for label in ("eager", "compiled"):
        ms = {name.removeprefix(f"{label} "): 1e3 * s for name, s in seconds.items() if name.startswith(label)}
        fit = fit_line([(1, ms["decode 1"])] + [(n, ms[f"verify {n}"]) for n in args.tokens])
        decode = ms["decode 1"]
        report["modes"][label] = {
            "ms": ms, "verify_fit_ms": fit,
            "verify_over_decode": {n: ms[f"verify {n}"] / decode for n in args.tokens},
            "draft_over_decode": {n: ms[f"draft {n}"] / decode for n in args.tokens},
            # The most a step of the largest block can gain when it adds `tokens_per_step` tokens: k decodes over
            # one draft and one verify (a smaller block adds fewer tokens: measure it with bench.py).
            "ideal_speedup": args.tokens_per_step * decode / (ms[f"draft {largest}"] + ms[f"verify {largest}"])}
    return report


def print_report(report: dict, tokens: Sequence[int], tokens_per_step: float) -> None:
    conditions = report["conditions"]
    print(f"pass costs, demo pair, cache length {conditions['context']}, {conditions['threads']} thread(s), "
          f"torch {conditions['torch']}, minimum over {conditions['rounds']} rounds (ms)")
    for label, mode in report["modes"].items():
        ms, fit = mode["ms"], mode["verify_fit_ms"]
        print(f"\n{label}: decode {ms['decode 1']:.3f}; verify = {fit['overhead']:.3f} + n * {fit['per_token']:.3f} "
              f"(overhead + n tokens * per token, fitted)")
        print("  block   verify  draft  verify/decode  draft/decode")
        for n in tokens:
            print(f"  {n:5d} {ms[f'verify {n}']:8.3f} {ms[f'draft {n}']:6.3f} {mode['verify_over_decode'][n]:14.2f} "
                  f"{mode['draft_over_decode'][n]:13.2f}")
        print(f"  ideal speedup at block {max(tokens)}, {tokens_per_step:g} tokens per step: "
              f"{mode['ideal_speedup']:.2f}x")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=generate.WEIGHTS / "tiny-qwen3")
    p.add_argument("--draft", type=Path, default=generate.WEIGHTS / "tiny-qwen3-dflash")
    p.add_argument("--tokens", type=checked(int, "at least 2", lambda x: x >= 2), nargs="+", default=[2, 4, 8, 16],
                   help="the block sizes whose verify and draft passes are timed (decode is 1 token)")
    p.add_argument("--context", type=positive_int, default=100, help="committed tokens in the caches")
    # the demo pair's at block 16 (bench.py, 60 problems)
    p.add_argument("--tokens-per-step", type=positive, default=6.9,
                   help="for the ideal speedup: the tokens a step of the largest block adds (bench.py measures it)")
    p.add_argument("--threads", type=thread_count, default=1, help="CPU threads for torch")
    p.add_argument("--rounds", type=positive_int, default=15)
    p.add_argument("--repeats", type=positive_int, default=10)
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    return p


def run(args) -> int:
    check_report_output(args.json, "--json", {"--model": args.model, "--draft": args.draft})
    torch.set_num_threads(args.threads)
    report = measure(args)
    print_report(report, args.tokens, args.tokens_per_step)
    if args.json:
        write_report(args.json, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
