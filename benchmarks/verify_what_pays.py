"""Beyond the paper, measured before adopted: verify only the drafts that pay for themselves.

    python benchmarks/verify_what_pays.py                       # the demo pair, eager
    python benchmarks/verify_what_pays.py --compile --json docs/results/verify_compiled.json

Where each verified token costs time (verify(n) = a + b n with b not small: a CPU core, compiled or
in float32), a step may stop its verify early. After the draft, slot k's confidence q_k is the
drafter's probability of its own guess; if the drafter is calibrated, all drafts through slot k
are kept with chance c_k = q_1 ... q_k, so verifying the first L drafts buys 1 + c_1 + ... + c_L
tokens for draft + verify(L + 1) milliseconds (this machine's calibrated costs, as for
--block-size auto). The policy verifies the L among --lengths (a few, so that compiled passes keep
a few static shapes) that buys the most tokens per millisecond. Lossless by construction: the
target still decides every kept token; it is only offered fewer drafts.

Compared, greedy, on the prompt set, in turns, the least time over --rounds: DFlash at the
drafter's block; at the block --block-size auto picks; the policy; and the bound no confidence
rule choosing among the same lengths can pass: a policy that foresees the first miss and verifies
the fewest drafts that hold every draft kept (the full block's tokens per step, the least verify).
Every output is checked against the plain loop's.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

import generate
from cpu_study import cpu_description, listed
from dflash.block_choice import best_block, logged_acceptance, machine_costs
from bench_common import write_report
from dflash.cli import OneLineErrors, UsageError, checked, run_cli
from dflash.measure import Wrapped
from sweep_common import add_sweep_options, load_sweep


def verify_cost(costs: dict, n: int) -> float:
    line = costs["verify_fit_ms"]
    return line["overhead"] + n * line["per_token"]


class VerifyWhatPays(Wrapped):
    """A runner whose draft hands the loop only the first L drafts, L chosen per step from the
    drafter's confidence and the pass costs; the loop then verifies L + 1 slots."""

    def __init__(self, runner, costs: dict, lengths: Sequence[int]):
        super().__init__(runner)
        block = runner.block_size
        self.lengths = sorted(lengths)
        draft_ms = costs["draft_fit_ms"]["overhead"] + block * costs["draft_fit_ms"]["per_token"]
        self.step_ms = torch.tensor([draft_ms + verify_cost(costs, n + 1) for n in self.lengths])
        self.chosen: list[int] = []

    def draft(self, features: torch.Tensor, last_token: int) -> torch.Tensor:
        logits = self.runner.draft(features, last_token)  # (block - 1, vocab)
        confidence = torch.softmax(logits.float(), dim=-1).amax(dim=-1)  # (block - 1,)
        tokens = 1 + confidence.cumprod(0).cumsum(0)  # verifying k + 1 drafts buys tokens[k]
        bought = tokens.cpu()[torch.tensor(self.lengths) - 1]  # (lengths,)
        rates = (bought / self.step_ms).tolist()  # tokens per ms of each length
        length = max(zip(rates, self.lengths))[1]  # a tie: the longer (it can only keep more)
        self.chosen.append(length)
        return logits[:length]


class Foreseeing(Wrapped):
    """A runner that verifies the fewest drafts of `lengths` that hold every draft the target will
    keep: it knows `truth` (the prompt and the plain loop's output) and so the first wrong draft."""

    def __init__(self, runner, truth: list[int], lengths: Sequence[int]):
        super().__init__(runner)
        self.truth = torch.tensor(truth, device=runner.block_offsets.device)
        self.lengths = sorted(lengths)

    def draft(self, features: torch.Tensor, last_token: int) -> torch.Tensor:
        logits = self.runner.draft(features, last_token)  # (block - 1, vocab)
        start = self.runner.target_cache.length  # of `last_token`
        truth = self.truth[start + 1:start + self.runner.block_size]
        drafts = logits[:len(truth)].argmax(dim=-1)
        wrong = (drafts != truth).nonzero()
        kept = int(wrong[0]) if len(wrong) else len(truth)
        return logits[:min([n for n in self.lengths if n >= kept] or [len(logits)])]


def variants(target, drafter, args, costs: dict, auto: int, truths: list[list[int]]):
    """name -> a maker of the runner for prompt i; and the policy's runner (it counts choices)."""
    longest = max(map(len, truths)) + args.max_new_tokens + 2 * drafter.config.block_size
    block = drafter.config.block_size

    def runner(n: int):
        return generate.ModelRunner(target, drafter, block_size=n, max_length=longest,
                                    compile=args.compile)

    full = runner(block)  # shared by the wrappers: every call starts with a prefill
    paying = VerifyWhatPays(full, costs, args.lengths)
    makers = {f"block {block}": lambda i: full, "verify what pays": lambda i: paying,
              "foreseeing bound": lambda i: Foreseeing(full, truths[i], args.lengths)}
    if auto != block:
        best = runner(auto)
        makers[f"block {auto} (auto)"] = lambda i: best
    return makers, paying


def measure(target, drafter, prompts, stops, makers, args, clock) -> dict:
    def run_all(make) -> list:
        return [generate.generate_dflash(target, drafter, ids, args.max_new_tokens,
                                         stop_ids=stops, runner=make(i))
                for i, ids in enumerate(prompts)]

    for make in makers.values():  # unmeasured: allocations, kernels, compiling
        run_all(make)
    best, results = dict.fromkeys(makers, float("inf")), {}
    for _ in range(args.rounds):
        for name, make in makers.items():
            began = clock()
            results[name] = run_all(make)
            best[name] = min(best[name], clock() - began)
    return best, results


def run(args) -> int:
    device, target, drafter, prompts, stops = load_sweep(args)
    block = drafter.config.block_size
    if max(args.lengths) > block - 1:
        raise UsageError(f"--lengths {max(args.lengths)} is past the drafter's {block - 1} drafts")
    costs, _ = machine_costs(generate.ModelRunner, target, drafter, args.compile)
    acceptance = logged_acceptance(args.draft)
    if acceptance is None:
        raise UsageError(f"{args.draft} has no training log to choose the auto block from")
    auto, _ = best_block(costs, acceptance, costs["blocks"])
    plain = [generate.generate_autoregressive(target, ids, args.max_new_tokens, stop_ids=stops)
             for ids in prompts]
    truths = [ids + result.new_ids for ids, result in zip(prompts, plain)]
    makers, paying = variants(target, drafter, args, costs, auto, truths)
    clock = time.process_time if torch.get_num_threads() == 1 and device.type == "cpu" \
        else time.perf_counter
    seconds, results = measure(target, drafter, prompts, stops, makers, args, clock)
    fastest = min(seconds, key=seconds.get)
    rows = {}
    for name, runs in results.items():
        tokens, steps = sum(r.new_tokens for r in runs), sum(r.steps for r in runs)
        rows[name] = {"tokens_per_s": tokens / seconds[name], "seconds": seconds[name],
                      "tokens_per_step": (tokens - len(runs)) / steps, "steps": steps,
                      "same_as_plain": all(r.new_ids == p.new_ids for r, p in zip(runs, plain))}
    shares = {n: paying.chosen.count(n) / len(paying.chosen) for n in args.lengths}
    report = {"conditions": {"cpu": cpu_description(), "device": str(device),
                             "dtype": str(target.embed_tokens.weight.dtype).removeprefix("torch."),
                             "compile": args.compile,
                             "threads": torch.get_num_threads(), "torch": torch.__version__,
                             "prompts": str(args.prompts), "max_new_tokens": args.max_new_tokens,
                             "rounds": args.rounds, "lengths": args.lengths},
              "verify_fit_ms": costs["verify_fit_ms"], "draft_fit_ms": costs["draft_fit_ms"],
              "auto_block": auto, "rows": rows, "lengths_chosen": shares}
    print(f"verify = {costs['verify_fit_ms']['overhead']:.2f} + "
          f"{costs['verify_fit_ms']['per_token']:.3f} n ms; lengths chosen by the policy: "
          + ", ".join(f"{n} drafts {share:.0%}" for n, share in shares.items()))
    print("| loop | tokens/step | tokens/s | over the fastest | same as plain |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['tokens_per_step']:.2f} | {row['tokens_per_s']:.1f} | "
              f"{seconds[fastest] / row['seconds']:.3f} | {row['same_as_plain']} |")
    if args.json:
        write_report(args.json, report)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=listed(checked(int, "positive", lambda x: x > 0),
                                            rule="comma-separated positive int"),
                   default=[3, 7, 11, 15], help="the drafts a step may verify (default 3,7,11,15)")
    add_sweep_options(p, "loop")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
