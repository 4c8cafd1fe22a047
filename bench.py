"""Benchmark DFlash against plain decoding on a prompt set, in one run, on one machine.

    python bench.py --model DIR --draft DIR --prompts FILE \\
        --block-sizes 4 8 16 --temperatures 0 0.7 1.0 --max-new-tokens 128

Both loops run on every prompt, after a warm-up (which also compiles, when
compiling), with the same caches and the same seed. The table reports, per block
size and temperature: tau (mean tokens committed per target pass, pooled over all
steps), the acceptance histogram, tokens/s of both loops (total new tokens over total
seconds) and the speedup. The conditions are printed with it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from dflash.cli import (PROMPT_FORMAT, OneLineErrors, add_device_options, encode_prompt, find_tokenizer, pick_device,
                        pick_dtype, read_prompts, run_cli, stop_token_ids)
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from generate import WEIGHTS, Generation, ModelRunner, generate_autoregressive, generate_dflash


def machine() -> str:
    """What ran the benchmark: GPU or CPU model, torch version, CPU threads."""
    if torch.cuda.is_available():
        chip = torch.cuda.get_device_name()
    else:
        cpuinfo = Path("/proc/cpuinfo")
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")] if cpuinfo.exists() else []
        chip = names[0] if names else platform.processor() or "unknown CPU"
    return f"{chip}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def pooled(results: list[Generation]) -> tuple[float, float]:
    """(tau, tokens/s) over a whole prompt set: totals, not means of ratios."""
    steps = sum(r.steps for r in results)
    tokens, seconds = sum(r.new_tokens for r in results), sum(r.seconds for r in results)
    tau = sum(sum(r.acceptance_lengths) for r in results) / steps if steps else 0.0
    return tau, tokens / seconds if seconds else 0.0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1] + "\n" + PROMPT_FORMAT,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash")
    p.add_argument("--prompts", type=Path, default=WEIGHTS / "heldout_prompts.jsonl")
    p.add_argument("--block-sizes", type=int, nargs="+", default=None, help="default: the drafter's")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    add_device_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on for CUDA, off for CPU")
    p.add_argument("--chat", action="store_true", default=None, help="default: when the tokenizer has a template")
    p.add_argument("--raw", dest="chat", action="store_false")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    return p


def run(args) -> int:
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype)
    tokenizer = find_tokenizer(args.model)
    prompts = [encode_prompt(prompt, tokenizer, args.chat) for prompt in read_prompts(args.prompts)]
    block_sizes = args.block_sizes or [drafter.config.block_size]
    compile = device.type == "cuda" if args.compile is None else args.compile
    mode = "reduce-overhead" if compile and device.type == "cuda" else None
    max_length = max(map(len, prompts)) + args.max_new_tokens + max(block_sizes)
    runners = {b: ModelRunner(target, drafter, max_length=max_length, block_size=b, compile=compile, mode=mode)
               for b in block_sizes}
    stop_ids = stop_token_ids(args.model, tokenizer)
    conditions = (f"{machine()}; device {device}, {str(dtype).removeprefix('torch.')}, batch 1, "
                  f"compile {'on' if compile else 'off'}, {len(prompts)} prompts, "
                  f"max {args.max_new_tokens} new tokens, block sizes {block_sizes}, temperatures {args.temperatures}")
    print(conditions)

    def baseline(prompt, temperature, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate_autoregressive(target, prompt, max_new_tokens, temperature=temperature, stop_ids=stop_ids,
                                       generator=generator, runner=runners[block_sizes[0]])

    def dflash(prompt, temperature, block_size, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate_dflash(target, drafter, prompt, max_new_tokens, block_size=block_size,
                               temperature=temperature, stop_ids=stop_ids, generator=generator,
                               runner=runners[block_size])

    warm_up = min(args.max_new_tokens, 4 * max(block_sizes) + 4)  # compiles, and records CUDA graphs
    baseline(prompts[0], 0.0, warm_up)
    for block_size in block_sizes:
        dflash(prompts[0], 0.0, block_size, warm_up)

    summary = []
    for temperature in args.temperatures:
        plain = [baseline(prompt, temperature) for prompt in prompts]
        _, plain_speed = pooled(plain)
        for block_size in block_sizes:
            fast = [dflash(prompt, temperature, block_size) for prompt in prompts]
            print(f"\nblock {block_size}, temperature {temperature}:")
            print(f"  {'prompt':>6} {'tau':>6} {'tok/s':>9} {'baseline tok/s':>15}")
            for index, (f, p) in enumerate(zip(fast, plain)):
                print(f"  {index:>6} {f.mean_acceptance:>6.2f} {f.tokens_per_second:>9.1f} {p.tokens_per_second:>15.1f}")
            tau, speed = pooled(fast)
            if temperature == 0:  # greedy must be lossless: say so from this very run
                same = sum(f.new_ids == p.new_ids for f, p in zip(fast, plain))
                print(f"  greedy output identical to the baseline on {same}/{len(prompts)} prompts")
            histogram = [sum(counts) for counts in zip(*(f.histogram(block_size) for f in fast))]
            summary.append({"block_size": block_size, "temperature": temperature, "mean_acceptance": tau,
                            "acceptance_histogram": histogram, "tokens_per_second": speed,
                            "baseline_tokens_per_second": plain_speed, "speedup": speed / plain_speed,
                            "per_prompt": [{"mean_acceptance": f.mean_acceptance,
                                            "tokens_per_second": f.tokens_per_second,
                                            "baseline_tokens_per_second": p.tokens_per_second}
                                           for f, p in zip(fast, plain)]})

    print(f"\n{'block':>5} {'temp':>5} {'tau':>6} {'DFlash tok/s':>13} {'baseline tok/s':>15} {'speedup':>8}  "
          f"acceptance histogram (1..block)")
    for row in summary:
        print(f"{row['block_size']:>5} {row['temperature']:>5} {row['mean_acceptance']:>6.2f} "
              f"{row['tokens_per_second']:>13.1f} {row['baseline_tokens_per_second']:>15.1f} "
              f"{row['speedup']:>7.2f}x  {row['acceptance_histogram']}")
    if args.json:
        args.json.write_text(json.dumps({"conditions": conditions, "results": summary}, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
