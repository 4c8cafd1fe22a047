"""Which block to draft: the one that adds the most tokens per second on this machine.

A block of n tokens buys, per step, the target's own token and every draft kept before the first
miss, and costs one draft pass and one verify pass of n tokens. Both sides move with n: the tokens
by the drafter's acceptance at each slot, the cost by the machine (on a GPU or a CPU multiplying
bf16 a 16-token verify costs nearly what a decode does; compiled on a CPU core, each token adds).
So the best block is a property of the pair *and* the machine, and is worked out from both:

    expected tau (n)     = 1 + a1 + a1 a2 + ... + a1 ... a(n-1)     (a_k: slot k's acceptance)
    predicted speed (n)  = expected tau (n) / (draft(n) + verify(n))

The pass costs come from a short calibration through the runner the loops use (each pass's least
time over many rounds, at a few blocks; lines fitted to them for the blocks between), cached per
machine, threads, dtype, compile mode and model shape. The acceptance comes from the drafter's
training log (its per-slot accuracy, the figure nearest to what serving sees), or, for a drafter
without a log, from the mean acceptance of a few steps at its full block.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from dflash.checkpoint import read_side_file, write_json_atomically
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling

CALIBRATION_LENGTH = 128  # committed tokens in the caches while the passes are timed
LOG_NAME = "train_log.jsonl"  # train.py's, next to the drafter's weights
SLOT_FIGURES = ("heldout_slot_accuracy", "slot_accuracy")  # per-slot figures in a log, best first


# ------------------------------------------------------------------ the model of a step


def expected_tau(acceptance: Sequence[float], block_size: int) -> float:
    """The mean acceptance length (tau) of steps of `block_size`: the target's token, then draft k
    when every draft up to k is kept, with probability a1 * ... * ak (a_k = acceptance[k - 1])."""
    total, reach = 1.0, 1.0
    for rate in acceptance[:block_size - 1]:
        reach *= rate
        total += reach
    return total


def geometric(p: float, block_size: int) -> list[float]:
    """The same acceptance p at every slot: the model of the speculative-decoding analyses."""
    return [p] * (block_size - 1)


def acceptance_for(tau: float, block_size: int) -> float:
    """The per-slot p whose expected tau is `tau` (1 <= tau <= block_size), by bisection:
    the mean grows with p, from 1 at p = 0 to block_size at p = 1."""
    if tau >= block_size:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = ((middle, high) if expected_tau(geometric(middle, block_size), block_size)
                     < tau else (low, middle))
    return (low + high) / 2


def pass_ms(costs: dict, name: str, n: int) -> float:
    """The `name` pass's milliseconds at block n (`calibrate`'s): as timed, the least over many
    rounds, where n was timed; else from the line fitted to the blocks that were. A pass's cost
    is not quite a line (on the demo pair, eager, verifying 16 tokens cost what 12 did)."""
    timed = costs.get(f"{name}_ms", {})
    for key in (n, str(n)):  # int keys; str once kept as JSON
        if key in timed:
            return timed[key]
    line = costs[f"{name}_fit_ms"]
    return line["overhead"] + n * line["per_token"]


def predicted_speeds(costs: dict, acceptance: Sequence[float], blocks: Sequence[int]) -> dict:
    """Tokens per millisecond of each of `blocks`, from the pass costs (`pass_ms`)."""
    return {n: expected_tau(acceptance, n) / (pass_ms(costs, "draft", n)
                                                 + pass_ms(costs, "verify", n))
            for n in blocks}


def best_block(costs: dict, acceptance: Sequence[float], blocks: Sequence[int]) -> tuple[int, dict]:
    """The block of `blocks` with the highest predicted speed, and each one's prediction. Only
    blocks whose passes were timed are offered: a shape never run can be slower than the line
    through its neighbours (a block of 11 ran 5 % slower than one of 12 on the demo pair,
    compiled: benchmarks/block_sweep.py)."""
    speeds = predicted_speeds(costs, acceptance, blocks)
    return max(speeds, key=speeds.get), speeds


# ------------------------------------------------------------------ the drafter's acceptance


def logged_acceptance(drafter_folder: Path) -> list[float] | None:
    """The per-slot acceptance in the drafter's training log, from its last line that has one
    (held-out figures before training ones); None without a log, or with one that is not as
    train.py writes it (one note says why: `log_problem`). A line cut by a killed run is not
    counted."""
    records = read_side_file(Path(drafter_folder) / LOG_NAME, "training log", log_problem,
                             lines=True)
    found = None
    for _, record in records or ():
        figures = [record[name] for name in SLOT_FIGURES if name in record]
        if figures:
            found = [float(rate) for rate in figures[0]]
    return found


def log_problem(records: list[tuple[str, object]]) -> str | None:
    """What makes a training log unfit to choose a block from, or None: a line that is not a
    JSON object, or a per-slot figure that is not a non-empty list of rates in 0..1 (a NaN rate
    would make every block's prediction NaN, and the first block offered win)."""
    for where, record in records:
        line = where.rpartition(":")[2]
        if not isinstance(record, dict):
            return f"line {line} is not a JSON object"
        for name in SLOT_FIGURES:
            if name in record and not are_rates(record[name]):
                return f"line {line}: {name} must be a non-empty list of rates in 0..1"
    return None


def are_rates(rates) -> bool:
    return isinstance(rates, list) and bool(rates) and all(is_between(rate, 0, 1)
                                                           for rate in rates)


def measured_acceptance(acceptance_lengths: Sequence[int], block_size: int) -> list[float]:
    """A per-slot acceptance for a drafter without a log, from steps run at `block_size`: the same
    p at every slot, fitted to their tau (a few steps cannot tell slots apart)."""
    tau = sum(acceptance_lengths) / len(acceptance_lengths)
    return geometric(acceptance_for(tau, block_size), block_size)


# ------------------------------------------------------------------ the machine's pass costs


def steady_runner(runner_class, target: Qwen3, drafter: Drafter, block_size: int, length: int,
                  compile: bool):
    """A runner for blocks of `block_size` in the middle of a reply, through its own methods: the
    target's cache holds `length` tokens, half the last block kept; the drafter's all but that
    half, the next draft's new context. `runner_class` is generate.py's ModelRunner (the package
    does not import a script)."""
    kept = block_size // 2
    runner = runner_class(target, drafter, max_length=length + 64, block_size=block_size,
                          compile=compile)
    prompt = torch.randint(0, target.config.vocab_size - 2, (length - kept,),
                           generator=torch.Generator().manual_seed(0))
    first, features = runner.prefill(prompt, Sampling(), None)
    drafts = runner.draft(features, first).argmax(dim=-1)  # the drafter's cache takes the prompt
    runner.verify(drafts)
    runner.commit(kept)  # the target's cache holds `length` tokens
    return runner


def step_passes(runner, block_size: int) -> dict[str, Callable[[], object]]:
    """The verify and draft passes of a steady-state step (`steady_runner`), each committing
    nothing, so that every call costs the same."""
    drafts = torch.arange(1, block_size, device=runner.block_offsets.device)  # (block - 1,)
    kept = block_size // 2  # the kept half of the last block: the next draft's new context
    return {f"verify {block_size}": lambda: runner.verify(drafts),
            f"draft {block_size}": lambda: runner.draft(runner.features[:, :kept], 1,
                                                        commit=False)}


def fit_line(points: Sequence[tuple[int, float]]) -> dict[str, float]:
    """Least-squares overhead and per_token of cost = overhead + tokens * per_token."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return {"overhead": mean_y - slope * mean_x, "per_token": slope}


def calibrate(runner_class, target: Qwen3, drafter: Drafter, blocks: Sequence[int], *,
              compile: bool = False, rounds: int = 3, calls: int = 2, seconds: float = 1.0,
              timer: Callable | None = None) -> dict:
    """Milliseconds of the draft and verify passes at each of `blocks` (two at least) and the lines
    fitted to them. Each pass's cost is the least over rounds of `calls` calls' mean: `rounds` at
    least, more until a block has been timed for `seconds` (a small model's passes are short, and
    the least of many is what a busy machine leaves alone). The passes of one block take turns, as
    in a loop, so that neither finds the caches warm from itself."""
    timer = timer or seconds_taken
    device = target.embed_tokens.weight.device
    draft_ms, verify_ms = {}, {}
    for n in blocks:
        runner = steady_runner(runner_class, target, drafter, n, CALIBRATION_LENGTH, compile)
        passes = step_passes(runner, n)
        for job in passes.values():
            job()  # compiles, allocates
        best, total, done = dict.fromkeys(passes, float("inf")), 0.0, 0
        while done < rounds or (total < seconds and done < 100 * rounds):
            spent = dict.fromkeys(passes, 0.0)
            for _ in range(calls):
                for name, job in passes.items():
                    spent[name] += timer(job, device)
            best = {name: min(best[name], spent[name] / calls) for name in passes}
            total, done = total + sum(spent.values()), done + 1
        verify_ms[n], draft_ms[n] = 1e3 * best[f"verify {n}"], 1e3 * best[f"draft {n}"]
    return {"blocks": list(blocks), "draft_ms": draft_ms, "verify_ms": verify_ms,
            "draft_fit_ms": fit_line(list(draft_ms.items())),
            "verify_fit_ms": fit_line(list(verify_ms.items()))}


def seconds_taken(job: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of `job()`, the device's queue drained before and after it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    job()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


# ------------------------------------------------------------------ the cache of calibrations


def cache_file() -> Path:
    """Where calibrations are kept: $DFLASH_CACHE, else the user's cache folder."""
    if os.environ.get("DFLASH_CACHE"):
        return Path(os.environ["DFLASH_CACHE"]) / "block_costs.json"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dflash" / "block_costs.json"


def machine_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model as /proc/cpuinfo gives it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        found = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    except OSError:
        found = None
    return found[1].strip() if found else platform.processor() or platform.machine()


def calibration_key(target: Qwen3, drafter: Drafter, compile: bool) -> str:
    """What the costs depend on: the machine, torch, threads, dtype, compile mode, the shapes."""
    weight, t, d = target.embed_tokens.weight, target.config, drafter.config
    return " | ".join([machine_name(weight.device), f"torch {torch.__version__}",
                       f"{torch.get_num_threads()} threads",
                       str(weight.dtype).removeprefix("torch."),
                       "compiled" if compile else "eager",
                       f"target {t.num_hidden_layers}x{t.hidden_size}/{t.intermediate_size} "
                       f"vocab {t.vocab_size}",
                       f"drafter {d.layers.num_hidden_layers} layers block {d.block_size}",
                       f"context {CALIBRATION_LENGTH}"])


def cached_calibration(key: str, measure: Callable[[], dict],
                       blocks: Sequence[int]) -> tuple[dict, bool]:
    """The costs kept under `key`, or `measure()`'s, then kept; and whether they were measured now.
    A cache that cannot be read, or whose entry for `key` is not whole (`costs_problem`), is
    measured over with one note, not trusted; one that is not a regular file is left alone."""
    path = cache_file()
    kept = read_side_file(path, "block-size calibration cache",
                          lambda cache: cache_problem(cache, key, blocks)) or {}
    if key in kept:
        return kept[key], False
    costs = measure()
    if path.exists() and not path.is_file():  # a FIFO or a folder: not ours to replace
        return costs, True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, {**kept, key: costs})
    except OSError:  # a read-only home: the choice is still made, only not kept
        pass
    return costs, True


def cache_problem(cache, key: str, blocks: Sequence[int]) -> str | None:
    """What makes the cache unfit to read `key`'s costs from, or None (no entry is fine)."""
    if not isinstance(cache, dict):
        return "expected a JSON object of calibrations"
    if key not in cache:
        return None
    problem = costs_problem(cache[key], blocks)
    return f"its entry for this machine and pair: {problem}" if problem else None


# A pass's milliseconds kept in the cache are at most this (11 days): a larger figure is no
# measurement, and one of 400 digits would overflow the float it is divided into.
MOST_MS = 1e9


def is_between(value, low: float, high: float) -> bool:
    """A JSON number (not true/false) from low to high, compared as it is (never converted, so
    no overflow); NaN and the infinities are in no such range."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def costs_problem(costs, blocks: Sequence[int]) -> str | None:
    """What is wrong with kept pass costs, or None: they must time exactly `blocks` (the ones
    offered), each pass in finite milliseconds above 0 (the costs divide the tokens), and fit
    lines of finite numbers (read between the blocks timed)."""
    if not isinstance(costs, dict):
        return "expected a JSON object"
    if costs.get("blocks") != list(blocks):
        return f"blocks must be {list(blocks)}, got {json.dumps(costs.get('blocks'))[:80]}"
    for name in ("draft", "verify"):
        timed, line = costs.get(f"{name}_ms"), costs.get(f"{name}_fit_ms")
        if not isinstance(timed, dict) or sorted(timed) != sorted(map(str, blocks)):
            return f"{name}_ms must give the milliseconds of blocks {list(blocks)}"
        if not all(is_between(ms, 0, MOST_MS) and ms > 0 for ms in timed.values()):
            return f"{name}_ms must be numbers above 0, up to {MOST_MS:g}"
        if not (isinstance(line, dict) and sorted(line) == ["overhead", "per_token"]
                and all(is_between(ms, -MOST_MS, MOST_MS) for ms in line.values())):
            return f"{name}_fit_ms must be {{overhead, per_token}}, numbers within {MOST_MS:g}"
    return None


def calibration_blocks(largest: int, compile: bool = False) -> list[int]:
    """The blocks timed, and so offered: every even one up to the drafter's (and its own), or,
    compiled (each a graph to build), five across 2..largest."""
    if not compile:
        return sorted({*range(2, largest + 1, 2), largest})
    return sorted({2, max(2, largest // 4), max(2, largest // 2), max(2, 3 * largest // 4),
                   largest})


def machine_costs(runner_class, target: Qwen3, drafter: Drafter,
                  compile: bool) -> tuple[dict, bool]:
    """This machine's pass costs for the pair (`calibrate`), kept; and whether measured now."""
    blocks = calibration_blocks(drafter.config.block_size, compile)
    return cached_calibration(calibration_key(target, drafter, compile), lambda: calibrate(
        runner_class, target, drafter, blocks, compile=compile), blocks)


# ------------------------------------------------------------------ the choice


def choose_block(runner_class, target: Qwen3, drafter: Drafter, drafter_folder: Path, *,
                 compile: bool, first_steps: Callable[[], object], say=None) -> int:
    """`--block-size auto`: the block with the highest predicted speed; a line saying why goes to
    `say` (default: standard error). `first_steps()` runs a few steps at the drafter's own block
    and returns what they generated (its `acceptance_lengths`); it is called only for a drafter
    without a training log."""
    largest = drafter.config.block_size
    acceptance = logged_acceptance(drafter_folder)
    source = f"per-slot acceptance from {LOG_NAME}"
    if acceptance is None:
        lengths = first_steps().acceptance_lengths
        acceptance = measured_acceptance(lengths, largest)
        source = f"acceptance {acceptance[0]:.2f} per slot from {len(lengths)} first steps"
    costs, measured = machine_costs(runner_class, target, drafter, compile)
    block, speeds = best_block(costs, acceptance, costs["blocks"])
    where = "calibrated now" if measured else "calibrated before"
    (say or (lambda line: print(line, file=sys.stderr)))(
        f"[block size auto: {block}, predicted {speeds[block] / speeds[largest]:.2f}x the tokens/s "
        f"of block {largest}; {source}; pass costs {where}, kept in {cache_file()}]")
    return block
