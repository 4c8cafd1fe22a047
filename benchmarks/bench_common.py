"""What the benchmarks share: the process's peak memory, text tables, reply checks, a timer for
short calls, and their reports' outputs (never over an input, written whole or not at all).

bench.py, bench_load.py and bench_train.py each measure peak memory, and bench.py and
bench_train.py print their results as tables. Replies are checked for repetition and
their final number by bench.py, the target's evaluation (recipes/) and the demo pair's tests.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from dflash.checkpoint import write_atomically
from dflash.cli import check_output, refuse_overlap


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes so far: CUDA's largest allocation, or the RSS high-water mark (VmHWM; None without /proc).

    Unlike getrusage's maximum, VmHWM can be restarted and never counts a parent's pages after a fork.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    status = Path("/proc/self/status")
    return int(re.search(r"VmHWM:\s*(\d+)", status.read_text())[1]) * 1024 if status.exists() else None


def reset_peak_memory(device: torch.device) -> None:
    """Restart `peak_memory` from what the process holds now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # 5: VmHWM back to the current RSS


def print_table(title: str, columns: Sequence[tuple[str, str]], lines: list[Sequence]) -> None:
    """`title`, then a right-aligned table; each column is a (header, format spec), and a spec ending in "x"
    marks a ratio ("1.73x"). A missing value (None) prints as "-"."""
    def cell(value, spec: str) -> str:
        return "-" if value is None else format(value, spec.rstrip("x")) + ("x" if spec.endswith("x") else "")

    cells = [[header for header, _ in columns]] + [[cell(v, spec) for v, (_, spec) in zip(line, columns)]
                                                   for line in lines]
    widths = [max(map(len, column)) for column in zip(*cells)]
    print(f"\n{title}\n" + "\n".join("  " + " ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells))


def least_time(loops: dict[str, dict[str, Callable[[], object]]], rounds: int, calls: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per call of each job: the least over `rounds` of the mean of `calls` calls (a shared machine's noise
    only ever adds time). The jobs of one loop take turns call by call, as a decoding loop's passes do: a pass
    repeated on its own finds what it reads still in the CPU's caches and runs up to a third faster than between
    the others (measured on the demo pair). The loops take turns within a round, so a busy spell hits them alike.
    `clock` is wall time unless told: one thread's runs on a busy machine can read the process's CPU time
    (`time.process_time`), which a neighbour's share of the cores does not inflate."""
    jobs = {name: job for loop in loops.values() for name, job in loop.items()}
    best = dict.fromkeys(jobs, float("inf"))
    for job in jobs.values():
        job()  # compiles, allocates
    for _ in range(rounds):
        for loop in loops.values():
            spent = dict.fromkeys(loop, 0.0)
            for _ in range(calls):
                for name, job in loop.items():
                    began = clock()
                    job()
                    spent[name] += clock() - began
            best |= {name: min(best[name], spent[name] / calls) for name in loop}
    return best


# ------------------------------------------------------------------ reports' outputs


def check_report_output(path: Path | None, option: str, inputs: Mapping[str, object],
                        folder: bool = False) -> None:
    """Refuse, before any work, an output the run could not write (`check_output`) or would write
    over what it reads (`refuse_overlap`). No output given: nothing to check."""
    if path is not None:
        check_output(Path(path), option, folder)
        refuse_overlap({option: path}, dict(inputs))


def write_report(path: Path, report) -> None:
    """A report as JSON (paths and the like as text), whole or not at all: written beside the
    target, then renamed over it, so a run stopped mid-write (Ctrl-C, a full disk) leaves the file
    as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=1, default=str) + "\n"
    write_atomically(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
