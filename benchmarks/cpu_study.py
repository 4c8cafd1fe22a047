"""Does DFlash pay on a CPU? Real Qwen3 shapes, random weights, the real loops at the published tau.

    python benchmarks/cpu_study.py --shapes Qwen3-0.6B --dtype bfloat16,float32 --threads 1 \\
        --json docs/results/cpu_study_0.6b.json
    python benchmarks/cpu_study.py --shapes Qwen3-4B --new-tokens 32 --tokens 2,4,8,12,16
    python benchmarks/cpu_study.py --dtype float32 --measure-blocks 8,12 --clock wall
    python benchmarks/cpu_study.py --shapes tiny --rounds 1     # seconds: checks that it runs
    python benchmarks/cpu_study.py --dtype float32 --tokens 16 --compile   # the fast path

Each shape is a target with random weights in the official layout (nothing is downloaded) and a
drafter of the authors' kind (5 layers of the target's width, block 16), built straight in the
dtype asked for. For each shape, dtype and thread count:

1. The passes' costs, timed through the runner the loops use (pass_costs.py's calls) after a
   --context-token prompt: decode; verify and draft of n tokens for n in --tokens. The cost model
   is fitted to them by least squares: verify(n) = overhead + n * per_token; draft(n) likewise.
2. The real loops end to end, generate_autoregressive against generate_dflash in one process.
   The draft pass runs as always (its cost, its cache), but its guesses are replaced by the
   target's own greedy tokens with one miss per step, placed so that acceptance follows a stated
   model: each draft slot, once reached, is kept with the same probability p (a geometric law
   cut at the block), p solved so that the mean tokens per step equals --tau (default: the
   authors' published tau for Qwen3-8B on GSM8K). One parameter, fixed by tau alone: the i.i.d.
   acceptance of the speculative-decoding analyses (a real drafter's acceptance falls along the
   block; this model spreads it evenly). The steps' draws come from a low-discrepancy sequence,
   so that a run of a few steps already has a mean near the model's.
3. The prediction beside the measurement: tokens per step (as the loop measured it) * decode /
   (draft(B) + verify(B)); and a sweep over blocks: each block n's predicted speedup from its
   passes' costs (as timed, and from the fitted lines) and the same p, and the best block.
   --measure-blocks runs the DFlash loop at other blocks too, to check the sweep.

Every row carries the memory floor (dflash/fast_cpu.py): the weight bytes a decode reads, the read
bandwidth measured in the same run, floor_ms and decode_of_floor (floor_ms / decode_ms). --compile
runs the passes and the loops compiled, inductor with the weights frozen; the pass costs and the
loops share each compiled graph (one buffer length), and first_calls_s is the compiling's time.

Speedups compare the time after the first token (a prefill, timed on its own, is taken off both
loops' times); tokens/s are on the same basis. With one thread the clock is the process's CPU time
(--clock): on a machine shared with others, wall time measures the neighbours too. Every time is the
least over rounds. The JSON is written after every row.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from tqdm import tqdm

import bench_train
import generate
from bench_common import check_report_output, least_time, write_report
from dflash import fast_cpu
from dflash.cli import OneLineErrors, UsageError, checked
from dflash.cli import CORES, positive_int, run_cli, seed, thread_count
from dflash.block_choice import acceptance_for, best_block, fit_line, geometric
from dflash.block_choice import expected_tau
from dflash.drafter import Drafter, DrafterConfig, default_target_layer_ids
from dflash.measure import Wrapped, certain_logits
from dflash.qwen3 import Qwen3, Qwen3Config
from gpu_check import PUBLISHED_TAU
from pass_costs import pass_calls, runner_at

VOCAB = bench_train.VOCAB
# The official config.json shapes (bench_train.py keeps three of them); "tiny" is for the tests.
SHAPES = {
    "Qwen3-0.6B": dict(vocab_size=VOCAB, **bench_train.SHAPES["qwen3-0.6b"]),
    "Qwen3-1.7B": dict(vocab_size=VOCAB, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, tie_word_embeddings=True),
    "Qwen3-4B": dict(vocab_size=VOCAB, **bench_train.SHAPES["qwen3-4b"]),
    "Qwen3-8B": dict(vocab_size=VOCAB, **bench_train.SHAPES["qwen3-8b"]),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 tie_word_embeddings=True),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DRAFTER_LAYERS = 5  # the authors' drafters for Qwen3
DEFAULT_TAU = PUBLISHED_TAU["GSM8K"]  # Qwen3-8B, greedy, block 16
MEMORY_SHARE = 0.85  # a shape is built only if it needs at most this share of the memory available
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # --clock's readings


# ------------------------------------------------------------------ the machine


def cpu_description() -> dict:
    """The CPU's model, its logical CPUs, and whether it multiplies bf16 natively: AMX tiles
    (amx_bf16) or AVX-512 bf16 dot products (avx512_bf16), as /proc/cpuinfo's flags say."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = set(re.search(r"flags\s*:\s*(.*)", text)[1].split()) if "flags" in text else set()
    return {"model": model[1].strip() if model else "unknown", "logical_cpus": os.cpu_count(),
            "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None without it)."""
    info = Path("/proc/meminfo")
    found = re.search(r"MemAvailable:\s*(\d+)", info.read_text()) if info.exists() else None
    return int(found[1]) * 1024 if found else None


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


# ------------------------------------------------------------------ the models


def pair_on_meta(shape: dict, dtype: torch.dtype, block_size: int) -> tuple[Qwen3, Drafter]:
    """The target and its drafter on the `meta` device in `dtype`: shapes without memory."""
    config = Qwen3Config(**shape, dtype=str(dtype).removeprefix("torch."))
    layers = Qwen3Config(**{**config.__dict__, "num_hidden_layers": DRAFTER_LAYERS})
    layer_ids = default_target_layer_ids(config.num_hidden_layers, DRAFTER_LAYERS)
    drafter_config = DrafterConfig(layers, block_size, config.num_hidden_layers,
                                   config.vocab_size - 1, layer_ids)  # the mask token: the last id
    with torch.device("meta"):
        return Qwen3(config).to(dtype), Drafter(drafter_config).to(dtype)


def weight_bytes(*models: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for model in models for p in model.parameters())


def random_pair(shape: dict, dtype: torch.dtype, block_size: int) -> tuple[Qwen3, Drafter]:
    """The pair with random weights (std 0.02, norms 1), allocated once in `dtype`: a 4B target in
    bf16 never passes through float32, so it needs its 8 GB and no more."""
    models = []
    for model in pair_on_meta(shape, dtype, block_size):
        model = model.to_empty(device="cpu")
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.02) if parameter.dim() == 2 else parameter.fill_(1.0)
        model.rotary.inv_freq = model.rotary.inverse_frequencies()  # float32, as when loaded
        models.append(model.eval().requires_grad_(False))
    return models[0], models[1]


# ------------------------------------------------------------ the acceptance model


def planned_acceptance(p: float, block_size: int) -> Iterator[int]:
    """The drafts each step keeps (0..block_size - 1), drawn from the geometric law cut at the
    block: P(kept >= k) = p^k. The uniform draws are the golden-ratio sequence, spread evenly from
    the first step on, so that a short run's mean is near the law's (random draws would wander by a
    token over ten steps)."""
    for step in itertools.count():
        u = (0.5 + step * 0.6180339887498949) % 1.0  # in (0, 1)
        if p >= 1 or p <= 0:
            yield block_size - 1 if p >= 1 else 0
        else:  # kept >= k exactly when u <= p^k
            yield min(block_size - 1, int(math.log(u) / math.log(p)))


def forced_drafts(runner: generate.ModelRunner, truth: Sequence[int], plan: Iterator[int],
                  foresee: bool = False):
    """`runner`, wrapped so that its drafts are the target's own greedy tokens `truth` (prompt
    included) with one miss per step, after as many right guesses as `plan` says. The real draft
    pass still runs, for its cost and to keep the drafter's cache in step; the runner itself is not
    changed (`dflash.measure.Wrapped`). `foresee`: only the drafts to be kept are offered, so the
    verify reads no more slots than the step keeps (benchmarks/verify_what_pays.py's bound)."""
    vocab, block = runner.target.config.vocab_size, runner.block_size
    known = torch.tensor(list(truth))

    class Forced(Wrapped):
        def draft(self, features: torch.Tensor, last_token: int) -> torch.Tensor:
            runner.draft(features, last_token)
            start = runner.target_cache.length  # of `last_token`
            guesses = torch.zeros(block - 1, dtype=torch.long)  # past the truth's end: any ids
            part = known[start + 1:start + block]
            guesses[:len(part)] = part
            kept = next(plan)
            if kept < block - 1:
                guesses[kept] = (guesses[kept] + 1) % vocab  # the miss: any token but the target's
            offered = guesses[:kept] if foresee else guesses  # the miss, and past it, or not
            return certain_logits(offered, vocab)  # (offered, vocab): argmax the guesses

    return Forced(runner)


# ------------------------------------------------------------------ measuring


def pass_costs(target: Qwen3, drafter: Drafter, tokens: Sequence[int], context: int, rounds: int,
               repeats: int, clock: Callable[[], float], slots: int, compile: bool = False) -> dict:
    """Milliseconds of a decode and of the verify and draft of each n in `tokens`; fitted lines.
    The runners have the loops' `slots`, so that compiled (`compile`) they share the loops' graphs.
    Compiled, `first_calls_s` is the wall time of every pass's first call: the compiling."""
    options = fast_cpu.runner_options(compile)
    plain = generate.ModelRunner(target, None, max_length=slots, **options)
    plain.prefill(torch.arange(2, context + 2), 0.0, None)
    loops = {"plain": {"decode": lambda: plain.decode(1, 0.0, None)}}
    for n in tokens:
        runner = runner_at(target, drafter, n, context, compile, slots, **options)
        loops[f"block {n}"] = pass_calls(runner, n, context, "pass")
    first_calls = {name: clocked(time.perf_counter, job)[1]
                   for loop in loops.values() for name, job in loop.items()}
    seconds = least_time(loops, rounds, repeats, clock)
    ms = {name: 1e3 * spent for name, spent in seconds.items()}
    verify = {n: ms[f"pass verify {n}"] for n in tokens}
    draft = {n: ms[f"pass draft {n}"] for n in tokens}
    fits = {name: fit_line(list(costs.items()))
            for name, costs in (("verify", verify), ("draft", draft))} if len(tokens) > 1 else {}
    return {"decode_ms": ms["decode"], "verify_ms": verify, "draft_ms": draft,
            "verify_fit_ms": fits.get("verify"), "draft_fit_ms": fits.get("draft"),
            "first_calls_s": sum(first_calls.values())}


def self_consistent_truth(target: Qwen3, drafter: Drafter, runner: generate.ModelRunner,
                          prompt: list[int], truth: list[int], limit: int,
                          plan: Callable[[], Iterator[int]]) -> tuple[list[int], int, bool]:
    """The greedy continuation that the forced DFlash loop itself produces, from `truth` (the
    plain loop's). In bfloat16 a verify and a decode may break a near-tie differently, a forced
    right guess is then refused and the run leaves the truth, so the truth becomes that run's
    output until a run keeps to it. Each run should keep to its truth past the place where the
    last one left it (the steps before are the same, and a pass's rows do not see the rows after
    them), so the runs are capped at `limit`, not at a guess. Returns the truth (prompt included),
    the DFlash runs it took, and whether it settled."""
    for run in range(1, limit + 1):
        forced = forced_drafts(runner, truth, plan())
        output = generate.generate_dflash(target, drafter, prompt, limit, runner=forced).new_ids
        if prompt + output == truth:
            return truth, run, True
        truth = prompt + output
    return truth, limit, False


def clock_for(name: str, threads: int) -> str:
    """`auto`: the process's CPU time for one thread (what the work costs, whatever a neighbour on a
    busy machine takes of the cores), wall time for more (CPU time would add the threads up)."""
    return ("cpu" if threads == 1 else "wall") if name == "auto" else name


def clocked(clock: Callable[[], float], run: Callable[[], object]) -> tuple[object, float]:
    """`run()`'s result and the seconds `clock` counted while it ran."""
    began = clock()
    result = run()
    return result, clock() - began


def time_loops(target: Qwen3, drafter: Drafter, context: int, new_tokens: int,
               blocks: Sequence[int], p: float, rounds: int, seed: int,
               clock: Callable[[], float], foresee: int | None = None,
               compile: bool = False) -> dict:
    """The plain loop and DFlash at each of `blocks` on one random prompt, in turns, the least time
    of `rounds` runs each; DFlash with the forced acceptance (the same per-slot p at every block).
    A prefill, timed on its own, is taken off every loop: the time after the first token is what
    DFlash changes. Returns the plain loop's tokens/s and, by block, DFlash's figures; `foresee`
    (a block): also that block verifying only the drafts each step keeps. `compile`: the
    runners' passes compiled, the fast path's (dflash/fast_cpu.py)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab - 1, (context,), generator=generator).tolist()  # no mask token
    limit = new_tokens + max(blocks)  # the truth reaches past the timed runs' last block
    slots, options = loop_slots(context, new_tokens, blocks), fast_cpu.runner_options(compile)
    plain_runner = generate.ModelRunner(target, None, max_length=slots, **options)
    plain_truth = generate.generate_autoregressive(target, prompt, limit, runner=plain_runner)
    runs = {"prefill": lambda: plain_runner.prefill(prompt, 0.0, None),
            "plain": lambda: generate.generate_autoregressive(target, prompt, new_tokens,
                                                              runner=plain_runner)}
    plans, truths = {}, {}
    for n in blocks:
        runner = generate.ModelRunner(target, drafter, max_length=slots, block_size=n, **options)
        plans[n] = functools.partial(planned_acceptance, p, n)  # a fresh plan for every run
        truths[n] = self_consistent_truth(target, drafter, runner, prompt,
                                          prompt + plain_truth.new_ids, limit, plans[n])

        def dflash(runner=runner, n=n, foreseeing=False):
            forced = forced_drafts(runner, truths[n][0], plans[n](), foreseeing)
            return generate.generate_dflash(target, drafter, prompt, new_tokens, runner=forced)

        runs[n] = dflash
        if n == foresee:
            runs["foreseeing"] = functools.partial(dflash, foreseeing=True)
    seconds, results = {name: float("inf") for name in runs}, {}
    for _ in range(rounds):
        for name, run in runs.items():
            results[name], spent = clocked(clock, run)
            seconds[name] = min(seconds[name], spent)
    after_first = {name: seconds[name] - seconds["prefill"] for name in runs if name != "prefill"}
    by_block = {}
    for n in blocks:
        fast = results[n]  # the forced runs of a block are alike: the same steps and acceptance
        planned = [kept + 1 for kept in itertools.islice(plans[n](), fast.steps)]
        by_block[n] = {
            "dflash_tokens_per_s": (new_tokens - 1) / after_first[n],
            "measured_speedup": after_first["plain"] / after_first[n],
            "measured_speedup_with_prefill": seconds["plain"] / seconds[n],
            "tau": fast.mean_acceptance, "tokens_per_step": (new_tokens - 1) / fast.steps,
            "steps": fast.steps, "acceptance_lengths": fast.acceptance_lengths,
            "acceptance_as_planned": fast.acceptance_lengths == planned,
            "truth_runs": truths[n][1], "truth_settled": truths[n][2]}
    seen = {"foreseeing": {"block": foresee,
                           "dflash_tokens_per_s": (new_tokens - 1) / after_first["foreseeing"],
                           "over_full_block": after_first[foresee] / after_first["foreseeing"],
                           "same_output": results["foreseeing"].new_ids == results[foresee].new_ids}
            } if foresee else {}
    return {"plain_tokens_per_s": (new_tokens - 1) / after_first["plain"],
            "prefill_ms": 1e3 * seconds["prefill"], "blocks": by_block, **seen}


def loop_slots(context: int, new_tokens: int, blocks: Sequence[int]) -> int:
    """The cache slots of the loops' runners: the prompt, the truth's reach past the tokens timed
    (`time_loops`) and a block's room."""
    return context + new_tokens + 2 * max(blocks)


def block_sweep(costs: dict, p: float, fitted: bool = False) -> dict[int, float]:
    """Each block n's predicted speedup: its tokens per step under the same per-slot p, times a
    decode, over its draft and verify: as timed, or (`fitted`, every block from 2 up) from the
    fitted lines, which a noisy machine's odd timing does not move. Assumes a slot's acceptance
    does not depend on the block it is drafted in."""
    def cost(name: str, n: int) -> float:
        fit = costs[f"{name}_fit_ms"]
        return fit["overhead"] + n * fit["per_token"] if fitted else costs[f"{name}_ms"][n]

    blocks = range(2, max(costs["verify_ms"]) + 1) if fitted else costs["verify_ms"]
    step_ms = {n: cost("draft", n) + cost("verify", n) for n in blocks}
    return {n: expected_tau(geometric(p, n), n) * costs["decode_ms"] / ms
            for n, ms in step_ms.items()}


def study_row(target, drafter, args, shape: str, dtype: str, threads: int, progress: tqdm) -> dict:
    """One row: the passes' costs, the loops, the prediction beside the measurement, the sweep."""
    torch.set_num_threads(threads)
    clock = clock_for(args.clock, threads)
    load_before, began = load_average(), time.perf_counter()
    progress.set_postfix_str(f"{shape} {dtype} {threads} thread(s): read bandwidth")
    bandwidth = fast_cpu.read_bandwidth(args.pass_rounds + 2, CLOCKS[clock])
    progress.set_postfix_str(f"{shape} {dtype} {threads} thread(s): pass costs")
    blocks = sorted({args.block_size, *args.measure_blocks})
    slots = loop_slots(args.context, args.new_tokens, blocks)
    costs = pass_costs(target, drafter, args.tokens, args.context, args.pass_rounds,
                       args.pass_repeats, CLOCKS[clock], slots, args.compile)
    floor = fast_cpu.floor_fields(fast_cpu.decode_weight_bytes(target),
                                  bandwidth["read_gb_per_s"], costs["decode_ms"])
    progress.update()
    p = acceptance_for(args.tau, args.block_size)
    progress.set_postfix_str(f"{shape} {dtype} {threads} thread(s): the loops")
    loops = time_loops(target, drafter, args.context, args.new_tokens, blocks, p, args.rounds,
                       args.seed, CLOCKS[clock], args.block_size if args.foresee else None,
                       args.compile)
    progress.update()
    for n, figures in loops["blocks"].items():  # the cost model at the tokens per step measured
        figures["predicted_speedup"] = figures["tokens_per_step"] * costs["decode_ms"] / (
            costs["draft_ms"][n] + costs["verify_ms"][n])
    step_ms = costs["draft_ms"][args.block_size] + costs["verify_ms"][args.block_size]
    sweep = block_sweep(costs, p)
    fitted_sweep = {}
    if costs["verify_fit_ms"]:  # two block sizes or more
        fitted = block_sweep(costs, p, fitted=True)
        auto, _ = best_block(costs, geometric(p, args.block_size), args.tokens)  # as generate.py
        fitted_sweep = {"block_sweep_fitted": fitted,
                        "best_block_fitted": max(fitted, key=fitted.get), "auto_block": auto}
    return {"shape": shape, "dtype": dtype, "threads": threads, "clock": clock,
            "compiled": args.compile,
            "parameters_b": sum(x.numel() for x in target.parameters()) / 1e9, **costs,
            **floor, "bandwidth_probes": bandwidth,
            "plain_tokens_per_s": loops["plain_tokens_per_s"], "prefill_ms": loops["prefill_ms"],
            **loops["blocks"][args.block_size], "measured_blocks": loops["blocks"],
            **{key: loops[key] for key in ("foreseeing",) if key in loops},
            "tau_model": args.tau, "acceptance_per_slot": p,
            "predicted_speedup_at_model_tau": args.tau * costs["decode_ms"] / step_ms,
            "block_sweep": sweep, "best_block": max(sweep, key=sweep.get), **fitted_sweep,
            "load_average_before": load_before, "load_average_after": load_average(),
            "seconds": time.perf_counter() - began}


@torch.no_grad()
def study(args, save: Callable[[dict], None]) -> dict:
    """Every row the options ask for, the report so far `save`d after each; a shape that does not
    fit in memory is skipped, with why; none fitting is refused before anything is built."""
    report = {"conditions": conditions(args), "rows": [], "skipped": []}
    fitting = []
    for shape, dtype in itertools.product(args.shapes, args.dtype):
        why = too_large(args, shape, dtype)
        if why:
            report["skipped"].append({"shape": shape, "dtype": dtype, "reason": why})
        else:
            fitting.append((shape, dtype))
    if not fitting:  # a report of nothing measured is no study
        raise UsageError("nothing to measure: every shape is skipped (" + "; ".join(
            f"{s['shape']} {s['dtype']} {s['reason']}" for s in report["skipped"]) + ")")
    progress = tqdm(total=2 * len(fitting) * len(args.threads), desc="cpu study", unit="part",
                    file=sys.stderr)  # costs and loops per row
    for shape, dtype in fitting:
        progress.set_postfix_str(f"{shape} {dtype}: building")
        target, drafter = random_pair(SHAPES[shape], DTYPES[dtype], args.block_size)
        for threads in args.threads:
            report["rows"].append(study_row(target, drafter, args, shape, dtype, threads, progress))
            save(report)
        del target, drafter
    progress.close()
    return report


def positions_used(args) -> int:
    """The most cache slots a runner of the study holds: the prompt, the tokens generated and the
    truth's reach past them (`time_loops`)."""
    return args.context + args.new_tokens + 2 * max(args.tokens)


def too_large(args, shape: str, dtype: str) -> str | None:
    """Why the pair of `shape` in `dtype` cannot be studied here, or None: its weights and the
    caches of every runner (the plain one and one per block timed or run) would take more than
    MEMORY_SHARE of the memory available."""
    target, drafter = pair_on_meta(SHAPES[shape], DTYPES[dtype], args.block_size)
    config, element = target.config, DTYPES[dtype].itemsize
    per_slot = 2 * config.num_key_value_heads * config.head_dim * element  # keys and values
    per_slot *= config.num_hidden_layers + DRAFTER_LAYERS
    runners = 1 + len(args.tokens) + len(args.measure_blocks) + 2  # + --block-size, --foresee
    caches = per_slot * positions_used(args) * runners
    need = weight_bytes(target, drafter) + caches + frozen_copies(args, target, drafter)
    free = available_bytes()
    if free is None or need <= MEMORY_SHARE * free:
        return None
    frozen = ", the compiled graphs' frozen weights" if args.compile else ""
    return (f"needs {need / 2**30:.1f} GiB (weights{frozen} and caches of {positions_used(args)} "
            f"positions), {free / 2**30:.1f} GiB available")


def frozen_copies(args, target: Qwen3, drafter: Drafter) -> int:
    """Compiled (`--compile`), the bytes of the weights the graphs hold: each graph freezes its own
    copy, laid out for the matmul library. One decode, and per n in --tokens a verify (the
    target's) and a draft (the drafter's and the LM head's); the loops reuse them."""
    if not args.compile:
        return 0
    head = target.head_weight.numel() * target.head_weight.element_size()
    return weight_bytes(target) * (1 + len(args.tokens)) + (
        weight_bytes(drafter) + head) * len(args.tokens)


def conditions(args) -> dict:
    return {"cpu": cpu_description(), "torch": torch.__version__, "context": args.context,
            "new_tokens": args.new_tokens, "block_size": args.block_size, "tau_model": args.tau,
            "acceptance_model": "geometric per slot, cut at the block; golden-ratio draws",
            "pass_rounds": args.pass_rounds, "pass_repeats": args.pass_repeats,
            "loop_rounds": args.rounds, "compiled": args.compile,
            "backend": fast_cpu.runner_options(args.compile).get("backend", "eager"),
            "timing": "batch 1, random weights in the "
            "official shapes; the least time over rounds, on each row's clock (cpu: the process's "
            "CPU time; wall: wall time)", "load_average_at_start": load_average()}


# ------------------------------------------------------------------ the report


def markdown(report: dict, block_size: int) -> str:
    """The rows as a Markdown table, under a line of conditions."""
    where, cpu = report["conditions"], report["conditions"]["cpu"]
    native = ", ".join(flag for flag in ("amx_bf16", "avx512_bf16") if cpu[flag]) or "none"
    b = block_size
    lines = [f"CPU: {cpu['model']} ({cpu['logical_cpus']} logical CPUs; bf16 flags: {native}), "
             f"torch {where['torch']}, context {where['context']}, {where['new_tokens']} new "
             f"tokens, block {b}, tau model {where['tau_model']}", "",
             f"| shape | dtype | threads (clock) | compiled | decode ms | floor ms (GB/s) | "
             f"decode of floor | verify {b} / decode | draft {b} / "
             "decode | verify fit ms (a + b n) | tau | plain tok/s | DFlash tok/s | predicted | "
             "measured | best block (fitted costs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        decode, fit = row["decode_ms"], row["verify_fit_ms"]
        fitted = f"{fit['overhead']:.0f} + {fit['per_token']:.1f} n" if fit else "-"
        sweep = row.get("block_sweep_fitted", row["block_sweep"])
        best = row.get("best_block_fitted", row["best_block"])
        cells = [row["shape"], row["dtype"], f"{row['threads']} ({row['clock']})",
                 "yes" if row["compiled"] else "no", f"{decode:.1f}",
                 f"{row['floor_ms']:.1f} ({row['read_gb_per_s']:.1f})",
                 f"{row['decode_of_floor']:.0%}",
                 f"{row['verify_ms'][b] / decode:.2f}", f"{row['draft_ms'][b] / decode:.2f}",
                 fitted, f"{row['tau']:.2f}", f"{row['plain_tokens_per_s']:.2f}",
                 f"{row['dflash_tokens_per_s']:.2f}", f"{row['predicted_speedup']:.2f}x",
                 f"{row['measured_speedup']:.2f}x", f"{best} ({sweep[best]:.2f}x)"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    measured = [(row, n, figures) for row in report["rows"] if len(row["measured_blocks"]) > 1
                for n, figures in row["measured_blocks"].items()]
    if measured:  # --measure-blocks: the sweep's predictions beside the loops
        lines += ["", "| shape | dtype | threads | block | tau | predicted | measured |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {row['shape']} | {row['dtype']} | {row['threads']} | {n} | "
                  f"{figures['tau']:.2f} | {figures['predicted_speedup']:.2f}x | "
                  f"{figures['measured_speedup']:.2f}x |" for row, n, figures in measured]
    lines += [f"- {row['shape']} {row['dtype']}, {row['threads']} thread(s): verifying only the "
              f"drafts each step keeps (foreseeing), block {row['foreseeing']['block']}: "
              f"{row['foreseeing']['over_full_block']:.2f}x the full block's tokens/s"
              for row in report["rows"] if "foreseeing" in row]
    lines += [f"- {row['shape']} {row['dtype']}, {row['threads']} thread(s), compiled: the "
              f"passes' first calls (compiling) took {row['first_calls_s']:.0f} s"
              for row in report["rows"] if row["compiled"]]
    lines += [f"- skipped {s['shape']} {s['dtype']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the command line


def listed(kind, choices: Sequence | None = None, rule: str = ""):
    """An argparse type: a comma-separated list, each item of `kind` (among `choices`, if given)."""
    def parse(text: str) -> list:
        items = [piece.strip() for piece in text.split(",")]
        if choices is None:
            return list(dict.fromkeys(kind(item) for item in items))
        by_lower = {str(choice).lower(): choice for choice in choices}
        wrong = [item for item in items if item.lower() not in by_lower]
        if wrong:
            raise argparse.ArgumentTypeError(f"{wrong[0]!r} is not one of {', '.join(choices)}")
        return list(dict.fromkeys(by_lower[item.lower()] for item in items))

    parse.__name__ = rule or "list"
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    block = checked(int, "in 2..16", lambda x: 2 <= x <= 16)
    p.add_argument("--shapes", type=listed(str, list(SHAPES)), default=["Qwen3-0.6B"],
                   help=f"comma-separated, of {', '.join(SHAPES)} (default Qwen3-0.6B)")
    p.add_argument("--dtype", type=listed(str, list(DTYPES)), default=["bfloat16"],
                   help="comma-separated: float32, bfloat16 (default bfloat16)")
    p.add_argument("--threads",
                   type=listed(thread_count, rule=f"comma-separated int in 1..{CORES}"),
                   default=[1], help="comma-separated torch thread counts, e.g. 1,2 (default 1)")
    p.add_argument("--tokens", type=listed(block, rule="comma-separated int in 2..16"),
                   default=list(range(2, 17)),
                   help="the n of the verify(n) and draft(n) timed (default 2..16)")
    p.add_argument("--block-size", type=block, default=16,
                   help="the loops' block (default 16, the authors'); must be among --tokens")
    p.add_argument("--tau", type=checked(float, "at least 1", lambda x: 1 <= x < math.inf),
                   default=DEFAULT_TAU, help="mean tokens per step of the forced acceptance "
                   f"(default {DEFAULT_TAU}, the authors' for Qwen3-8B on GSM8K)")
    p.add_argument("--context", type=positive_int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=checked(int, "at least 2", lambda x: x >= 2), default=64,
                   help="tokens each loop generates (default 64)")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="runs of each loop, the fastest kept (default 2)")
    p.add_argument("--pass-rounds", type=positive_int, default=3,
                   help="pass_costs' rounds (default 3)")
    p.add_argument("--pass-repeats", type=positive_int, default=2,
                   help="calls per pass per round (default 2)")
    p.add_argument("--measure-blocks", type=listed(block, rule="comma-separated int in 2..16"),
                   default=[], help="also run the DFlash loop at these blocks, to set the sweep's "
                   "predictions beside measurements, e.g. 8,12 (default: --block-size only)")
    p.add_argument("--foresee", action="store_true",
                   help="also run --block-size verifying only the drafts each step keeps: the "
                   "bound of benchmarks/verify_what_pays.py's policy")
    p.add_argument("--clock", choices=["auto", "cpu", "wall"], default="auto",
                   help="what a time is: the process's CPU time or wall time (default auto: CPU "
                   "time for one thread, which a busy neighbour does not inflate; wall for more)")
    p.add_argument("--compile", action="store_true",
                   help="the passes and the loops compiled, the fast CPU path: inductor with the "
                   "weights frozen (dflash/fast_cpu.py); each n of --tokens compiles its own "
                   "verify and draft (minutes each at real sizes): give few, e.g. --tokens 16")
    p.add_argument("--seed", type=seed, default=0, help="the random prompt's (default 0)")
    p.add_argument("--json", type=Path, help="write {conditions, rows, skipped} to this file")
    return p


def run(args) -> int:
    check_report_output(args.json, "--json", {})  # random weights: no input to keep apart
    if args.block_size not in args.tokens:
        raise UsageError(f"--block-size {args.block_size} must be among --tokens {args.tokens}")
    missing = [n for n in args.measure_blocks if n not in args.tokens]
    if missing:
        raise UsageError(f"--measure-blocks {missing[0]} must be among --tokens {args.tokens}")
    if args.tau > args.block_size:
        raise UsageError(f"--tau {args.tau} is above the block's {args.block_size} tokens per step")
    positions = Qwen3Config.max_position_embeddings  # the shapes' own (none sets another)
    if positions_used(args) > positions:
        raise UsageError(f"--context {args.context} and --new-tokens {args.new_tokens} need "
                         f"{positions_used(args)} positions, past the shapes' {positions}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)

    def save(report: dict) -> None:  # after every row: a long run stopped keeps what it measured
        if args.json:
            write_report(args.json, report)

    report = study(args, save)
    save(report)
    print(markdown(report, args.block_size))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
