"""Benchmark DFlash against plain decoding on a prompt set, in one run, on one machine.

    python benchmarks/bench.py --block-sizes 4 8 16 --temperatures 0 0.7 --trees 16 --json FILE --plots DIR --peer transformers
    python benchmarks/bench.py --block-sizes 4 16 --temperatures 0.7 1 --draft-policy greedy sampled mixed:2 --filters none config

Pooled over prompts (totals, not means of ratios), and again over the prompts whose outputs do not repeat
(repetition flatters any drafter): tau, tokens/s, speedup, acceptance per draft slot, correct answers; from a second,
phase-timed pass, where a step's time goes. The oracle drafts the greedy continuation: the ceiling. The ideal
speedup k * t_decode / (t_draft + t_verify) counts the passes only, k the tokens a step added to the output (tau
counts an answer's last step whole, past the end of the output); the efficiency is the measured share of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
import sys
import time
from collections import namedtuple
from pathlib import Path
from typing import Sequence

import torch

import generate
from bench_common import check_report_output, peak_memory, print_table, write_report
from dflash.cli import (OneLineErrors, UsageError, add_device_options, checked,
                        non_negative, pick_device, pick_dtype, positive_int, run_cli, seed)
from dflash.drafter import Drafter
from dflash.measure import (BenchPrompt, Loops, Run, distinct_ngram_ratio, left_out, loop_figures, ratio,
                            step_ms, summarize_row)
from dflash.prompts import (PROMPT_FORMAT, add_prompt_options, check_no_mask_token, check_prompt_options,
                            check_request, encode_for_generation, read_prompts)
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling, generation_config, keep_only, sampled_slots
from dflash.tokenizer import find_tokenizer, stop_token_ids

# The figures of a loop printed, in order.
SUMMARY = ("prompts", "tau", "tokens_per_second", "speedup", "speedup_over_fastest_plain", "ideal_speedup",
           "efficiency", "accuracy", "first_token_ms", "time_per_output_token_ms")


# baseline: the plain loop's runs at the same sampling (and compile mode); policy: how DFlash drafts; filters: "" or
# e.g. "k20 p0.8"; compiled: the passes ran through torch.compile; warmup_seconds: the unmeasured calls before the runs.
Row = namedtuple("Row", "kind temperature block_size runs baseline policy filters compiled warmup_seconds",
                 defaults=("greedy", "", False, None))


def row_label(row: dict) -> str:
    """How the progress lines, the acceptance lines and the plots name a row (a report's, or its fields)."""
    drafts = "" if row["kind"] == "plain" else f", block {row['block_size']}, {row['policy']} drafts"
    mode = ", compiled" if row.get("compiled") else ""
    return f"{row['kind']}{drafts}{mode}, T={row['temperature']:g} {row['filters']}".rstrip()


def benchmark(loops: Loops, prompts: Sequence[BenchPrompt], block_sizes: Sequence[int], temperatures: Sequence[float],
              oracle: bool, trees: Sequence[int] = (), policies: Sequence[str] = ("greedy",),
              filter_sets: Sequence[dict] = ({},)) -> tuple[dict[Sampling, list[Run]], list[Row]]:
    """Each loop on every prompt at each sampling (above temperature 0: each filter set, each draft policy), against
    the plain loop at that sampling: the rows, and the plain loop's runs per `Sampling`."""
    baselines, rows = {}, []
    for sampling in [Sampling(t, **f) for t in temperatures for f in (filter_sets if t > 0 else [{}])]:
        ceiling = oracle and sampling.greedy  # the oracle's truths: past the limit, any stop token, the largest block
        truths = [loops.generate("plain", None, p, 0.0, loops.max_new_tokens + max(block_sizes), stop=False).new_ids
                  if ceiling else None for p in prompts]
        for kind, block_size, policy in ([("plain", None, "greedy")]
                                         + [("DFlash", b, policy) for b in block_sizes
                                            for policy in (["greedy"] if sampling.greedy else policies)]
                                         + [(f"tree {n}", max(block_sizes), "greedy") for n in trees]
                                         + [("oracle", b, "greedy") for b in block_sizes if ceiling]):
            row = Row(kind, sampling.temperature, block_size, None, None, policy, sampling.filters,
                      loops.runner_options.get("compile", False))
            print(f"[bench] {row_label(row._asdict())}", file=sys.stderr)
            warmup_seconds = warm_up(loops, row, sampling, prompts)
            runs = [loops.measure(kind, block_size, p, sampling, truth, policy) for p, truth in zip(prompts, truths)]
            baselines.setdefault(sampling, runs)  # the plain loop's, measured first
            rows.append(row._replace(runs=runs, baseline=baselines[sampling], warmup_seconds=warmup_seconds))
    return baselines, rows


def warm_up(loops: Loops, row: Row, sampling: Sampling, prompts: Sequence[BenchPrompt]) -> float:
    """Unmeasured calls that pay for allocations, kernel selection, compiling and recording CUDA graphs: the shortest
    and the longest prompt to the limit, never stopping, so that every bucket of cache slots a measured call reads
    (`dflash.compiled.keys_bucket`) is compiled before the clock runs. Returns their seconds (compiling included)."""
    began = time.perf_counter()
    by_length = sorted(prompts, key=lambda p: len(p.ids))
    for prompt in by_length[:1] + by_length[-1:]:
        loops.generate(row.kind, row.block_size, prompt, sampling, stop=False, policy=row.policy)
    seconds = time.perf_counter() - began
    print(f"[bench]   warm-up {seconds:.1f} s", file=sys.stderr)
    return seconds


def time_transformers(model_dir: Path, prompts: Sequence[BenchPrompt], max_new_tokens: int, stop_ids: Sequence[int],
                      device: torch.device, dtype: torch.dtype, plain: Sequence[Run]) -> dict:
    """transformers' greedy `generate` on the same target, prompts and limits, timed and checked against `plain`."""
    import transformers  # the optional `peer` extra: nothing else needs it

    transformers.logging.set_verbosity_error()
    dtype_keyword = "dtype" if tuple(map(int, transformers.__version__.split(".")[:2])) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_keyword: dtype}).to(device).eval()
    stop = dict(eos_token_id=list(stop_ids), pad_token_id=stop_ids[0]) if stop_ids else {}

    def peer_generate(prompt: BenchPrompt, tokens: int) -> list[int]:  # transformers' generate runs without gradients
        choices, ids = prompt.first_token_choices, torch.tensor([prompt.ids], device=device)  # ids: (1, n)
        heal = [lambda so_far, scores: keep_only(scores, choices) if so_far.shape[1] == len(prompt.ids) else scores]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens,
                             logits_processor=heal if choices else None, **stop)  # healing: the first token only
        return out[0, len(prompt.ids):].tolist()  # on the host: the device has finished

    peer_generate(prompts[0], min(max_new_tokens, 8))  # unmeasured, as the loops' first calls; it ends synchronized
    began = time.perf_counter()
    outputs = [peer_generate(prompt, max_new_tokens) for prompt in prompts]
    speed = ratio(sum(map(len, outputs)), time.perf_counter() - began)
    return {"library": "transformers", "version": transformers.__version__, "prompts": len(prompts),
            "tokens_per_second": speed, "plain_over_peer": ratio(loop_figures(plain)["tokens_per_second"], speed),
            "agree": sum(out == run.result.new_ids for out, run in zip(outputs, plain))}


def build_report(conditions: dict, prompts: Sequence[BenchPrompt], rows: Sequence[Row], memory: dict,
                 peer: dict | None) -> dict:
    """Everything the run measured, JSON-ready: each row's figures, and per prompt what its loop did beside the plain
    loop (greedy DFlash: and the oracle at its block); the plain loop's rows apart, a tree's also over the chain's."""
    oracles = {row.block_size: row.runs for row in rows if row.kind == "oracle"}
    reports = []
    for row in rows:
        oracle = oracles.get(row.block_size) if row.kind == "DFlash" and row.temperature == 0 else None
        per_prompt = []
        for i, (prompt, run, plain, out) in enumerate(zip(prompts, row.runs, row.baseline,
                                                          left_out(row.runs, row.baseline, row.temperature))):
            fast, slow = run.result, plain.result
            per_prompt.append({
                "index": i, "prompt": prompt.where, "new_tokens": fast.new_tokens, "tau": fast.mean_acceptance,
                "tokens_per_second": fast.tokens_per_second, "correct": run.correct, "output_ids": fast.new_ids,
                "acceptance_lengths": fast.acceptance_lengths, "identical_to_baseline": fast.new_ids == slow.new_ids,
                "speedup": ratio(fast.tokens_per_second, slow.tokens_per_second), "degenerate": out,
                "distinct_4gram_ratio": distinct_ngram_ratio(fast.new_ids),
                "baseline_distinct_4gram_ratio": distinct_ngram_ratio(slow.new_ids),
                **({"oracle_tau": oracle[i].result.mean_acceptance} if oracle else {})})  # speedup: the oracle row's
        summary = summarize_row(row.runs, row.baseline, row.temperature, row.block_size)
        reports.append({"kind": row.kind, "block_size": row.block_size, "temperature": row.temperature,
                        "policy": row.policy, "filters": row.filters, "compiled": row.compiled,
                        "warmup_seconds": row.warmup_seconds, **summary, "per_prompt": per_prompt})
    add_speedup_over_fastest_plain(reports)
    chains = {(r["block_size"], r["temperature"], r["filters"]): r for r in reports
              if r["kind"] == "DFlash" and r["policy"] == "greedy"}
    for tree in (r for r in reports if r["kind"].startswith("tree ")):
        for half in ("all", "non_degenerate"):  # an empty half has no figures: every ratio is None
            mine, chain = tree[half], chains[tree["block_size"], tree["temperature"], tree["filters"]][half]
            mine["versus_chain"] = {"tau": ratio(mine.get("tau"), chain.get("tau")),
                                    "step_cost": ratio(*(step_ms(f.get("per_step_ms")) for f in (mine, chain))),
                                    "speedup": ratio(mine.get("tokens_per_second"), chain.get("tokens_per_second"))}
    return {"conditions": conditions, "peak_memory": memory, "peer": peer,
            "baselines": [r for r in reports if r["kind"] == "plain"],
            "rows": [r for r in reports if r["kind"] != "plain"]}


def add_speedup_over_fastest_plain(reports: list[dict]) -> None:
    """Each loop's speed also against the fastest plain loop this run measured at its sampling, eager or compiled:
    a speedup over a slow baseline says little. Set on both halves, as `speedup_over_fastest_plain`."""
    for half in ("all", "non_degenerate"):
        fastest = {}
        for plain in (r for r in reports if r["kind"] == "plain"):
            key, speed = (plain["temperature"], plain["filters"]), plain[half].get("tokens_per_second") or 0.0
            fastest[key] = max(fastest.get(key, 0.0), speed)
        for r in reports:
            r[half]["speedup_over_fastest_plain"] = ratio(r[half].get("tokens_per_second"),
                                                          fastest.get((r["temperature"], r["filters"])) or None)


def print_report(report: dict) -> None:
    """Every loop over all prompts, then the non-degenerate ones if any was left out; acceptance, memory, peer."""
    rows = sorted(report["baselines"] + report["rows"], key=lambda row: (row["temperature"], row["filters"]))
    rows = sorted(rows, key=lambda row: (row["temperature"], row["filters"], row["compiled"]))
    columns = [("temp", "g"), ("filters", "s"), ("mode", "s"), ("block", "d"), ("loop", "s"), ("same", "d"),
               ("prompts", "d"), ("tau", ".2f"), ("tok/s", ".1f"), ("speedup", ".2fx"), ("vs fastest", ".2fx"),
               ("ideal", ".2fx"), ("efficiency", ".2f"),
               ("correct", ".0%")] + [(name, ".2f") for name in ("1st ms", "token ms", "draft", "verify", "decode",
                                                                  "rest", "step")]
    for half in ("all", "non_degenerate"):
        if half == "all" or any(r[half]["prompts"] < r["all"]["prompts"] for r in rows):
            lines = []
            for r in rows:
                figures, steps = r[half], r[half].get("per_step_ms", {})
                kept = [p for p in r["per_prompt"] if half == "all" or not p["degenerate"]]
                same = sum(p["identical_to_baseline"] for p in kept) if r["temperature"] == 0 else None
                loop = r["kind"] if r["policy"] == "greedy" else f"{r['kind']} {r['policy']}"
                mode = "compiled" if r["compiled"] else "eager"
                lines.append([r["temperature"], r["filters"], mode, r["block_size"], loop, same,
                              *map(figures.get, SUMMARY),
                              *map(steps.get, ("draft", "verify", "decode", "accept_and_bookkeeping")), step_ms(steps)])
            print_table(f"{half.replace('_', '-')} prompts (same: greedy output as the plain loop's; correct: the last "
                        "number is the answer;\ntau: an answer's last step counted whole, even past the end of the "
                        "output; speedup: over the plain loop of its mode; vs fastest: over the fastest plain loop of "
                        "the run;\nideal: from the tokens a step added to it; ms: to the 1st token, per token after "
                        "it, per step: draft, verify, decode, the rest (accepting, bookkeeping), in all)",
                        columns, lines)
    warmups = [f"{row_label(r)} {r['warmup_seconds']:.1f} s" for r in report["baselines"] + report["rows"]
               if r["warmup_seconds"] is not None]
    print("warm-up, unmeasured (the shortest and the longest prompt; compiling included): " + "; ".join(warmups))
    for row in report["rows"]:  # how often draft slot k was kept, given slot k-1 was
        rates = " ".join("-" if r is None else f"{r:.2f}" for r in row["all"]["per_position_acceptance"])
        print(f"acceptance per slot, {row_label(row)}: {rates}")
    memory = report["peak_memory"]
    print(f"\npeak memory: {(memory['bytes'] or float('nan')) / 2**20:.0f} MiB ({memory['what']}, the whole process)")
    if (peer := report["peer"]) is not None:
        print(f"{peer['library']} {peer['version']} generate (greedy): {peer['tokens_per_second']:.1f} tok/s, the "
              f"plain loop {peer['plain_over_peer'] or 0:.2f}x that; same outputs on {peer['agree']}/{peer['prompts']}")


def write_plots(folder: Path, report: dict) -> list[Path]:
    """Three PNGs, one curve per row: acceptance per draft slot, the acceptance histogram, the speedup per prompt."""
    import matplotlib.pyplot as plt  # the optional `plots` extra

    plt.switch_backend("Agg")  # files only, no window
    folder.mkdir(parents=True, exist_ok=True)
    plots = {"per_position_acceptance": ("draft slot k", "P(slot k kept | slot k-1 kept)",
                                         lambda row: row["all"]["per_position_acceptance"]),
             "acceptance_histogram": ("tokens accepted per step", "share of steps", lambda row: [
                 n / max(row["all"]["steps"], 1) for n in row["all"]["acceptance_histogram"]]),
             "speedup_per_prompt": ("prompt", "speedup", lambda row: [p["speedup"] for p in row["per_prompt"]])}
    for name, (xlabel, ylabel, values) in plots.items():
        figure, axes = plt.subplots(figsize=(8, 4))
        for row in report["rows"]:
            ys = [float("nan") if y is None else y for y in values(row)]
            axes.plot(range(1, len(ys) + 1), ys, marker="o", label=row_label(row))
        axes.set(xlabel=xlabel, ylabel=ylabel, title=f"{ylabel} (all prompts)")
        axes.legend(fontsize=7)
        figure.savefig(folder / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(figure)
    return [folder / f"{name}.png" for name in plots]


def require(module: str, extra: str, why: str) -> None:
    """Refuse, before anything runs, an option whose optional dependency is missing."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{why} needs {module}, which is not installed (pip install -e '.[{extra}]')")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1] + "\n" + PROMPT_FORMAT,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=generate.WEIGHTS / "tiny-qwen3")
    p.add_argument("--draft", type=Path, default=generate.WEIGHTS / "tiny-qwen3-dflash")
    p.add_argument("--prompts", type=Path, default=generate.WEIGHTS / "heldout_problems.jsonl")
    p.add_argument("--block-sizes", type=checked(int, "at least 2", lambda x: x >= 2), nargs="+", default=None,
                   help="default: the drafter's")
    p.add_argument("--temperatures", type=non_negative, nargs="+", default=[0.0])
    p.add_argument("--trees", type=positive_int, nargs="+", default=[], metavar="N", help="also draft trees of N nodes")
    p.add_argument("--draft-policy", nargs="+", default=["greedy"], metavar="greedy|sampled|mixed:K",
                   help="above temperature 0, the draft policies to compare (generate.py's --draft-policy)")
    p.add_argument("--filters", nargs="+", choices=["none", "config"], default=["none"],
                   help="above temperature 0: the bare softmax, and/or the top-k/top-p of generation_config.json")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--seed", type=seed, default=0)
    add_device_options(p)
    p.add_argument("--compile", nargs="?", const="on", choices=["on", "off", "both"], default=None,
                   help="torch.compile the fixed-shape passes; `both`: eager, then compiled, each speedup also against "
                        "the faster of the two plain loops (default: on for CUDA, off for the CPU)")
    p.add_argument("--no-compile", dest="compile", action="store_const", const="off", help="the eager passes only")
    add_prompt_options(p)
    p.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=True, help="also the ceiling, greedy")
    p.add_argument("--peer", choices=["transformers"], help="also time transformers' greedy generate (`peer` extra)")
    p.add_argument("--json", type=Path, help="also write everything to this file")
    p.add_argument("--plots", type=Path, metavar="DIR", help="also write PNG plots here (the `plots` extra)")
    return p


def run(args) -> int:
    check_prompt_options(args)
    if args.plots:
        require("matplotlib", "plots", "--plots")
    if args.peer:
        require(args.peer, "peer", f"--peer {args.peer}")
        if 0 not in args.temperatures:
            raise UsageError("--peer compares greedy outputs: include temperature 0 in --temperatures")
    inputs = {"--model": args.model, "--draft": args.draft, "--prompts": args.prompts}
    check_report_output(args.json, "--json", inputs)  # before any work: never over an input
    check_report_output(args.plots, "--plots", inputs, folder=True)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device, args.model)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype)
    tokenizer = find_tokenizer(args.model)
    prompts = [BenchPrompt(p.where, *encode_for_generation(p, tokenizer, args.chat, args.thinking, args.token_healing),
                           p.answer) for p in read_prompts(args.prompts)]
    block_sizes = args.block_sizes or [drafter.config.block_size]
    for prompt, block_size in itertools.product(prompts, block_sizes):  # what a loop would refuse midway, refused now
        check_request(target, drafter, prompt.ids, args.max_new_tokens, block_size=block_size,
                               tree_budget=max(args.trees, default=0), where=prompt.where)
        check_no_mask_token(drafter, prompt.ids, prompt.where)
    for policy in args.draft_policy:  # a bad policy is refused before anything runs
        sampled_slots(policy, min(block_sizes), Sampling(max(args.temperatures)) if policy != "greedy" else Sampling())
    config = generation_config(args.model) if "config" in args.filters else {}
    filter_sets = [{} if f == "none" else dict(top_k=config.get("top_k", 0), top_p=config.get("top_p", 1.0),
                                               min_p=config.get("min_p", 0.0)) for f in args.filters]
    compile = args.compile or ("on" if device.type == "cuda" else "off")
    loops = [Loops(target, drafter, stop_token_ids(args.model, tokenizer), args.seed, args.max_new_tokens,
                   max_length=max(len(p.ids) for p in prompts) + args.max_new_tokens + 2 * max(block_sizes),
                   runner_options=dict(compile=compiled, mode="reduce-overhead" if device.type == "cuda" else None),
                   decode=(lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if tokenizer else None,
                   engine=generate)
             for compiled in {"off": [False], "on": [True], "both": [False, True]}[compile]]
    cpus = re.findall(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()) if sys.platform == "linux" else []
    chip = torch.cuda.get_device_name(device) if device.type == "cuda" else (cpus or ["unknown CPU"])[0]
    conditions = {**vars(args), "machine": chip, "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "device": str(device), "dtype": str(dtype).removeprefix("torch."), "compile": compile,
                  "batch_size": 1, "prompts_file": args.prompts, "prompts": len(prompts), "block_sizes": block_sizes,
                  "healed_prompts": sum(p.first_token_choices is not None for p in prompts)}
    print("conditions:\n" + "\n".join(f"  {key.replace('_', ' ')}: {value}" for key, value in conditions.items()))
    baselines, rows = {}, []
    for mode in loops:  # eager, then compiled
        mode_baselines, mode_rows = benchmark(mode, prompts, block_sizes, args.temperatures, args.oracle, args.trees,
                                              args.draft_policy, filter_sets)
        baselines.setdefault(Sampling(), mode_baselines.get(Sampling()))  # the peer's comparison: the first mode's
        rows += mode_rows
    memory = {"what": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "RSS high-water mark (VmHWM)",
              "bytes": peak_memory(device)}  # before the peer loads a second copy of the target
    peer = time_transformers(args.model, prompts, args.max_new_tokens, loops[0].stop_ids, device, dtype,
                             baselines[Sampling()]) if args.peer else None
    report = build_report(conditions, prompts, rows, memory, peer)
    print_report(report)
    if args.json:
        write_report(args.json, report)
    for path in write_plots(args.plots, report) if args.plots else []:
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
