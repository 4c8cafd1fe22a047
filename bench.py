"""Benchmark DFlash against plain decoding on a prompt set, in one run, on one machine.

    python bench.py --model DIR --draft DIR --prompts FILE \\
        --block-sizes 4 8 16 --temperatures 0 0.7 1.0 --max-new-tokens 128 \\
        [--trees 8 16 32 64] [--json results.json] [--plots DIR] [--peer transformers]

What a speedup figure is worth depends on what the model wrote, so the benchmark
reports, from one run:

- **Speed and acceptance**, per prompt and pooled (totals over all steps and
  seconds, never means of ratios): tau, tokens/s of both loops and the speedup; time
  to the first token and per output token after it; the acceptance histogram and
  the per-position acceptance (how often draft slot k is kept, given slot k-1 was).
- **Repetition, apart.** A model that repeats itself makes the drafter look good:
  on a run of blank lines every block is accepted. Each output gets its
  distinct-4-gram ratio (distinct 4-grams / all 4-grams of the new token ids), and
  one below 0.3 is flagged degenerate. Every summary figure is given over all
  prompts and over the non-degenerate ones, side by side. At temperature 0 the
  plain loop's output (which DFlash's equals) is judged; at a higher temperature
  each loop's own output is, so the two subsets may differ.
- **Where the time goes**, per step: draft, verify, and the rest (accepting,
  bookkeeping: the loop's time minus the prefill, draft and verify), and the plain
  loop's decode step. Each loop runs twice on every prompt: a clean pass, which
  gives tokens/s and the time to first token, then a timed pass, in which the
  runner's `draft`, `verify` and `decode` are wrapped by a clock that waits for the
  GPU before reading the time. Those waits slow a CUDA run slightly, so no speed
  figure comes from the timed pass; only the per-step phase times do. (On CPU the
  clock costs next to nothing, but one rule for both devices is simpler to trust.)
- **The ceiling** (temperature 0): an oracle that drafts the target's own greedy
  continuation (computed first by the plain loop), so every block is accepted
  whole and tau is the block size. With the per-step times, the speedup a loop
  could reach at its tau if only the draft and verify passes cost anything is
  tau * t_decode / (t_draft + t_verify); the efficiency is the measured speedup
  over that. For the oracle, it says what the loop's own overheads cost. The
  measured speedup includes the prefill and the ideal does not, so a short output
  loses some efficiency to it; the JSON's `decode_speedup` compares the time per
  token after the first instead.
- **Chain against trees** (`--trees N ...`): draft trees of N nodes
  (`generate_dflash_tree`) at the largest block size, timed as the chain is (the
  tree's draft and verify passes are its "draft" and "verify"; building the tree,
  the walk and the compaction fall in the bookkeeping). A table puts them beside
  the chain at that block: tau, the cost of a step, and the speedups over the plain
  loop and over the chain. A tree pays for its tau with a costlier verify pass
  (N + 1 tokens instead of a block) and host work per step.
- **Side by side with what users know** (`--peer transformers`, needs the optional
  `transformers` extra): `transformers`' greedy `generate` on the same target,
  timed the same way, and its outputs checked against the plain loop's.

Both loops share the caches, the seed and the warm-up (outside the measured time).
Raw-text prompts get token healing, as in generate.py, unless --no-token-healing.
Peak memory is the whole process's: the RSS high-water mark on CPU (weights,
caches, every loop), the largest allocation on CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from dflash.cli import (PROMPT_FORMAT, OneLineErrors, UsageError, add_device_options, add_prompt_options,
                        encode_for_generation, find_tokenizer, pick_device, pick_dtype, read_prompts, run_cli,
                        stop_token_ids)
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from generate import (WEIGHTS, Generation, ModelRunner, acceptance_histogram, generate_autoregressive, generate_dflash,
                      generate_dflash_tree, keep_only, per_position_acceptance, synchronize)

NGRAM = 4  # repetition is judged on 4-grams of token ids
DEGENERATE_BELOW = 0.3  # a distinct-4-gram ratio under this is a degenerate (repetitive) output


# --------------------------------------------------------------------- the arithmetic
# Small pure functions, so that each figure the benchmark prints can be checked on
# step records made up by hand (tests/test_bench.py).


def distinct_ngram_ratio(ids: Sequence[int], n: int = NGRAM) -> float:
    """Distinct n-grams / all n-grams of `ids`: 1.0 when nothing repeats, near 0 for a loop.

    An output shorter than n has no n-gram, so nothing in it can repeat: its ratio
    is 1.0 (never degenerate). A stop token early in the output is the common case.
    """
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def is_degenerate(ids: Sequence[int]) -> bool:
    return distinct_ngram_ratio(ids) < DEGENERATE_BELOW


def final_number(text: str) -> str | None:
    """The last integer in a reply ("... The answer is 42." -> "42"): what an answer check compares."""
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


def accuracy(runs: Sequence["Run"]) -> float | None:
    """The share of correct replies among the runs whose prompt has a known answer (None: none has)."""
    checked = [run.correct for run in runs if run.correct is not None]
    return sum(checked) / len(checked) if checked else None


def pooled_tau(acceptance_lengths: Sequence[int]) -> float | None:
    """Mean tokens committed per verify pass over the steps of many runs (None without a step)."""
    return sum(acceptance_lengths) / len(acceptance_lengths) if acceptance_lengths else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ideal_speedup(tau: float, t_decode: float, t_draft: float, t_verify: float) -> float | None:
    """The speedup at `tau` if a step cost only its draft and verify passes: tau * t_decode / (t_draft + t_verify).

    The plain loop pays t_decode per token; DFlash pays t_draft + t_verify per step
    and commits tau tokens in it. Prefill and bookkeeping are what this leaves out.
    """
    return ratio(tau * t_decode, t_draft + t_verify) if None not in (tau, t_decode, t_draft, t_verify) else None


def efficiency(speedup: float, tau: float, t_decode: float, t_draft: float, t_verify: float) -> float | None:
    """Measured speedup / ideal speedup: the share of what tau promises that the loop delivers."""
    return ratio(speedup, ideal_speedup(tau, t_decode, t_draft, t_verify))


def step_ms(per_step_ms: dict[str, float | None]) -> float | None:
    """The cost of one step, in ms: its phases added up (draft, verify, bookkeeping), None if one is missing."""
    values = list(per_step_ms.values())
    return sum(values) if values and None not in values else None


# ------------------------------------------------------------------- one measured run


@dataclass
class BenchPrompt:
    """A prompt ready for the loops: ids, and the first token's choices when token healing applies."""

    where: str  # "file:line"
    ids: list[int]
    first_token_choices: list[int] | None = None
    answer: str | None = None  # the expected final answer, if the prompt file gives one


@dataclass
class Run:
    """One loop on one prompt: the clean pass's result, and the timed pass's with its phase times.

    `phase_seconds` holds the seconds spent in each phase of the runner (`ModelRunner.clock`) during the
    timed pass ("decode" for the plain loop; "draft" and "verify" for DFlash), and
    `phase_calls` how often each ran (once per step).
    """

    result: Generation
    timed: Generation
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phase_calls: dict[str, int] = field(default_factory=dict)
    correct: bool | None = None  # the reply's final number is the prompt's answer (None: no answer known)

    @property
    def bookkeeping_seconds(self) -> float:
        """The timed pass's time outside the prefill and the wrapped passes: accepting, committing, trimming."""
        return self.timed.seconds - self.timed.first_token_seconds - sum(self.phase_seconds.values())


class PhaseClock:
    """Adds up the seconds a runner spends in each phase (`ModelRunner.clock`).

    Before each reading of the clock it waits for the GPU (a no-op on CPU), so that
    the time of a pass is the time of its work and not of its launch.
    """

    def __init__(self, device: torch.device, phases: Sequence[str]):
        self.device = device
        self.seconds = dict.fromkeys(phases, 0.0)  # every phase reported, even one that never ran
        self.calls = dict.fromkeys(phases, 0)

    @contextmanager
    def __call__(self, phase: str):
        synchronize(self.device)
        began = time.perf_counter()
        yield
        synchronize(self.device)
        self.seconds[phase] += time.perf_counter() - began
        self.calls[phase] += 1


@contextmanager
def patched(runner: ModelRunner, **methods: Callable):
    """Replace methods of one runner (as attributes of the instance) for a while, then put back what was there."""
    saved = {name: runner.__dict__.get(name) for name in methods}
    for name, method in methods.items():
        setattr(runner, name, method)
    try:
        yield runner
    finally:
        for name, old in saved.items():
            if old is None:
                delattr(runner, name)
            else:
                setattr(runner, name, old)


def measure(loop: Callable[[], Generation], runner: ModelRunner, phases: Sequence[str], device: torch.device) -> Run:
    """Run `loop` twice: clean (the speed), then with the runner's `phases` timed (where the time goes)."""
    result = loop()
    runner.clock = PhaseClock(device, phases)
    try:
        timed = loop()
    finally:
        clock, runner.clock = runner.clock, None
    return Run(result, timed, clock.seconds, clock.calls)


def oracle_draft(runner: ModelRunner, truth: torch.Tensor) -> Callable:
    """A `runner.draft` that guesses `truth` (the prompt and its greedy continuation, (n,)) at every slot.

    The real draft pass still runs first, so that its cost is paid as in a real step
    and the drafter's cache stays in step with the target's; its guesses are then
    replaced by the truth. Every block is accepted whole.
    """
    real_draft = runner.draft

    def draft(context_features: torch.Tensor, last_token: int, start: int, after_prefill: bool) -> torch.Tensor:
        real_draft(context_features, last_token, start, after_prefill)
        return truth[start + 1:start + runner.block_size]  # (block - 1,): the tokens after `last_token`

    return draft


@dataclass
class Loops:
    """The two loops, bound to what every call of the benchmark shares: models, runners, stop tokens, seed."""

    target: Qwen3
    drafter: Drafter
    runners: dict[int, ModelRunner]  # one per block size
    stop_ids: list[int]
    seed: int
    max_new_tokens: int
    tree_runners: dict[int, ModelRunner] = field(default_factory=dict)  # one per tree budget
    decode: Callable[[list[int]], str] | None = None  # token ids -> text, to check replies against answers

    @property
    def device(self) -> torch.device:
        return self.target.embed_tokens.weight.device

    @property
    def plain_runner(self) -> ModelRunner:
        return self.runners[min(self.runners)]  # any runner serves the plain loop; its block only sizes the cache

    def generator(self) -> torch.Generator:
        return torch.Generator(self.device).manual_seed(self.seed)  # the same seed for every call

    def options(self, prompt: BenchPrompt, temperature: float, max_new_tokens: int | None) -> dict:
        """What every loop is called with: the same length, sampling, seed and first-token choices."""
        return dict(max_new_tokens=max_new_tokens or self.max_new_tokens, temperature=temperature,
                    generator=self.generator(), first_token_choices=prompt.first_token_choices)

    def plain(self, prompt: BenchPrompt, temperature: float, max_new_tokens: int | None = None,
              stop: bool = True) -> Generation:
        return generate_autoregressive(self.target, prompt.ids, stop_ids=self.stop_ids if stop else (),
                                       runner=self.plain_runner, **self.options(prompt, temperature, max_new_tokens))

    def dflash(self, prompt: BenchPrompt, temperature: float, block_size: int,
               max_new_tokens: int | None = None) -> Generation:
        return generate_dflash(self.target, self.drafter, prompt.ids, block_size=block_size, stop_ids=self.stop_ids,
                               runner=self.runners[block_size], **self.options(prompt, temperature, max_new_tokens))

    def tree(self, prompt: BenchPrompt, temperature: float, budget: int,
             max_new_tokens: int | None = None) -> Generation:
        return generate_dflash_tree(self.target, self.drafter, prompt.ids, budget=budget, stop_ids=self.stop_ids,
                                    runner=self.tree_runners[budget],
                                    **self.options(prompt, temperature, max_new_tokens))

    def checked(self, run: Run, prompt: BenchPrompt) -> Run:
        """`run`, with whether its reply reaches the prompt's answer (when there is one to check)."""
        if prompt.answer is not None and self.decode is not None:
            run.correct = final_number(self.decode(run.result.new_ids)) == prompt.answer
        return run

    def measure_plain(self, prompt: BenchPrompt, temperature: float) -> Run:
        run = measure(lambda: self.plain(prompt, temperature), self.plain_runner, ["decode"], self.device)
        return self.checked(run, prompt)

    def measure_dflash(self, prompt: BenchPrompt, temperature: float, block_size: int) -> Run:
        run = measure(lambda: self.dflash(prompt, temperature, block_size), self.runners[block_size],
                      ["draft", "verify"], self.device)
        return self.checked(run, prompt)

    def measure_tree(self, prompt: BenchPrompt, temperature: float, budget: int) -> Run:
        run = measure(lambda: self.tree(prompt, temperature, budget), self.tree_runners[budget], ["draft", "verify"],
                      self.device)
        return self.checked(run, prompt)

    def greedy_truth(self, prompt: BenchPrompt, longest_block: int) -> torch.Tensor:
        """The prompt and its greedy continuation, long enough for the oracle's last block: (n,).

        No stop token ends it: the oracle drafts past a stop token as the target would.
        """
        tail = self.plain(prompt, 0.0, self.max_new_tokens + longest_block, stop=False).new_ids
        return torch.tensor(prompt.ids + tail, device=self.device)

    def measure_oracle(self, prompt: BenchPrompt, block_size: int, truth: torch.Tensor) -> Run:
        runner = self.runners[block_size]
        with patched(runner, draft=oracle_draft(runner, truth)):
            return self.measure_dflash(prompt, 0.0, block_size)


# ------------------------------------------------------------------- pooled figures


def loop_figures(runs: Sequence[Run], block_size: int | None = None) -> dict:
    """One loop's figures over a set of prompts, pooled: totals over every token, step and second.

    Times are in milliseconds: to the first token (mean over prompts), per output
    token after the first, and per step for each phase of the timed pass.
    With `block_size` (DFlash), also the acceptance histogram and per-position rates.
    """
    if not runs:
        return {"prompts": 0}
    lengths = [length for run in runs for length in run.result.acceptance_lengths]
    tokens, seconds = sum(run.result.new_tokens for run in runs), sum(run.result.seconds for run in runs)
    first = [run.result.first_token_seconds for run in runs]
    timed_steps = sum(run.timed.steps for run in runs)
    phases = {name: sum(run.phase_seconds.get(name, 0.0) for run in runs) for name in runs[0].phase_seconds}
    phases["accept_and_bookkeeping"] = sum(run.bookkeeping_seconds for run in runs)
    figures = {
        "prompts": len(runs),
        "new_tokens": tokens,
        "steps": len(lengths),
        "tau": pooled_tau(lengths),
        "tokens_per_second": ratio(tokens, seconds),
        "first_token_ms": 1000 * sum(first) / len(first),
        "time_per_output_token_ms": ratio(1000 * (seconds - sum(first)), tokens - len(runs)),
        "per_step_ms": {name: ratio(1000 * total, timed_steps) for name, total in phases.items()},
        "accuracy": accuracy(runs),
    }
    if block_size is not None:
        figures["acceptance_histogram"] = acceptance_histogram(lengths, block_size)
        figures["per_position_acceptance"] = per_position_acceptance(lengths, block_size)
    return figures


def versus(fast: dict, plain: dict) -> dict:
    """`fast` against `plain` (both `loop_figures`): the speedup, the ideal speedup at its tau, the efficiency.

    The speedup is the measured one, prefill included, as a user sees it; the ideal
    counts the steps only, so a short output (whose prefill weighs more) loses some
    efficiency to it. `decode_speedup` compares the time per token after the first,
    which leaves the prefill out of both sides.
    """
    if not fast["prompts"] or not plain["prompts"]:
        return {"speedup": None, "decode_speedup": None, "ideal_speedup": None, "efficiency": None}
    speedup = ratio(fast["tokens_per_second"], plain["tokens_per_second"])
    t_draft, t_verify = fast["per_step_ms"]["draft"], fast["per_step_ms"]["verify"]
    ideal = ideal_speedup(fast["tau"], plain["per_step_ms"]["decode"], t_draft, t_verify)
    return {"speedup": speedup, "decode_speedup": ratio(plain["time_per_output_token_ms"],
                                                        fast["time_per_output_token_ms"]),
            "ideal_speedup": ideal, "efficiency": ratio(speedup, ideal)}


def degenerate_flags(runs: Sequence[Run]) -> list[bool]:
    return [is_degenerate(run.result.new_ids) for run in runs]


def row_degenerate_flags(runs: Sequence[Run], baseline: Sequence[Run], temperature: float) -> list[bool]:
    """Per prompt, whether a comparison leaves it out: the plain loop's judgement, or either loop's above 0."""
    plain = degenerate_flags(baseline)
    if temperature == 0:
        return plain
    return [p or f for p, f in zip(plain, degenerate_flags(runs))]


def summarize_row(runs: Sequence[Run], baseline: Sequence[Run], temperature: float, block_size: int) -> dict:
    """A DFlash (or oracle) row against the plain loop, over all prompts and over the non-degenerate ones.

    Degeneracy is judged on the plain loop's output at temperature 0 (DFlash's is the
    same); above it, a prompt is left out when either loop's output is degenerate, so
    that both sides of every speedup cover the same prompts.
    """
    flags = row_degenerate_flags(runs, baseline, temperature)
    subsets = {"all": [True] * len(runs), "non_degenerate": [not f for f in flags]}
    summary = {}
    for name, keep in subsets.items():
        fast = loop_figures([run for run, k in zip(runs, keep) if k], block_size)
        plain = loop_figures([run for run, k in zip(baseline, keep) if k])
        summary[name] = {**fast, **versus(fast, plain), "baseline": plain}
    return summary


# --------------------------------------------------------------------- the benchmark


@dataclass
class Row:
    """DFlash (or its oracle) at one temperature and block size, with the plain loop's runs on the same prompts."""

    kind: str  # "DFlash", "oracle" or "tree N" (a draft tree of N nodes)
    temperature: float
    block_size: int
    runs: list[Run]
    baseline: list[Run]

    @property
    def name(self) -> str:
        return f"{self.kind}, block {self.block_size}, temperature {self.temperature:g}"


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def warm_up(loops: Loops, prompt: BenchPrompt, block_sizes: Sequence[int], temperatures: Sequence[float]) -> float:
    """A short run of every loop, outside the measured time; returns its seconds.

    The first call pays one-time costs (allocations, kernel selection; compiling and
    recording CUDA graphs when compiled). Greedy and sampling passes compile apart,
    so each kind present is warmed up.
    """
    began = time.perf_counter()
    tokens = min(loops.max_new_tokens, 4 * max(block_sizes) + 4)
    for temperature in sorted({0.0 if t == 0 else 1.0 for t in temperatures}):
        loops.plain(prompt, temperature, tokens)
        for block_size in block_sizes:
            loops.dflash(prompt, temperature, block_size, tokens)
        for budget in loops.tree_runners:
            loops.tree(prompt, temperature, budget, tokens)
    return time.perf_counter() - began


def benchmark(loops: Loops, prompts: Sequence[BenchPrompt], block_sizes: Sequence[int],
              temperatures: Sequence[float], oracle: bool) -> tuple[dict[float, list[Run]], list[Row]]:
    """Every measured run: the plain loop per temperature, DFlash per temperature and block, the oracle at 0,
    and a tree per temperature and budget of `loops.tree_runners` (at their block size)."""
    baselines, rows = {}, []
    for temperature in temperatures:
        progress(f"temperature {temperature:g}: plain loop, {len(prompts)} prompts")
        baseline = baselines[temperature] = [loops.measure_plain(p, temperature) for p in prompts]
        for block_size in block_sizes:
            progress(f"temperature {temperature:g}: DFlash, block {block_size}")
            runs = [loops.measure_dflash(p, temperature, block_size) for p in prompts]
            rows.append(Row("DFlash", temperature, block_size, runs, baseline))
        for budget, runner in loops.tree_runners.items():
            progress(f"temperature {temperature:g}: tree of {budget} nodes, block {runner.block_size}")
            runs = [loops.measure_tree(p, temperature, budget) for p in prompts]
            rows.append(Row(f"tree {budget}", temperature, runner.block_size, runs, baseline))
        if oracle and temperature == 0:
            progress("temperature 0: the oracle (drafts = the target's own greedy continuation)")
            truths = [loops.greedy_truth(p, max(block_sizes)) for p in prompts]
            for block_size in block_sizes:
                runs = [loops.measure_oracle(p, block_size, truth) for p, truth in zip(prompts, truths)]
                rows.append(Row("oracle", 0.0, block_size, runs, baseline))
    if oracle and 0 not in temperatures:
        progress("no oracle: it drafts the greedy continuation, so it needs temperature 0 in --temperatures")
    return baselines, rows


# ------------------------------------------------------------- the peer: transformers


def time_transformers(model_dir: Path, prompts: Sequence[BenchPrompt], max_new_tokens: int, stop_ids: Sequence[int],
                      device: torch.device, dtype: torch.dtype, plain: Sequence[Run]) -> dict:
    """`transformers`' greedy `generate` on the same target and prompts, timed as the plain loop is.

    Loaded with the same dtype on the same device, warmed up, then one call per
    prompt with the same stop tokens and limit; a healed prompt's first token is
    restricted to the same choices (a logits processor for the first step only).
    `plain` (the plain loop's greedy runs) is what its outputs are checked against.
    The import lives here: the project itself never needs transformers.
    """
    import transformers  # the optional `peer` extra

    transformers.logging.set_verbosity_error()
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    dtype_keyword = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_keyword: dtype}).to(device).eval()

    class FirstTokenChoices(transformers.LogitsProcessor):
        """Token healing: at the first step, every token outside `choices` gets probability 0."""

        def __init__(self, prompt_length: int, choices: Sequence[int]):
            self.prompt_length, self.choices = prompt_length, list(choices)

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] != self.prompt_length:
                return scores
            return keep_only(scores, self.choices)

    stop = dict(eos_token_id=list(stop_ids), pad_token_id=stop_ids[0]) if stop_ids else {}

    def generate(prompt: BenchPrompt, tokens: int) -> list[int]:
        ids = torch.tensor([prompt.ids], device=device)  # (1, n)
        processors = transformers.LogitsProcessorList(
            [FirstTokenChoices(len(prompt.ids), prompt.first_token_choices)] if prompt.first_token_choices else [])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens,
                             logits_processor=processors, **stop)
        return out[0, len(prompt.ids):].tolist()

    with torch.no_grad():
        generate(prompts[0], min(max_new_tokens, 8))  # the warm-up
        outputs, seconds = [], 0.0
        for prompt in prompts:
            synchronize(device)
            began = time.perf_counter()
            outputs.append(generate(prompt, max_new_tokens))
            synchronize(device)
            seconds += time.perf_counter() - began
    tokens = sum(map(len, outputs))
    speed = ratio(tokens, seconds)
    plain_speed = loop_figures(plain)["tokens_per_second"]
    return {"library": "transformers", "version": transformers.__version__, "prompts": len(prompts),
            "new_tokens": tokens, "tokens_per_second": speed, "plain_tokens_per_second": plain_speed,
            "plain_over_peer": ratio(plain_speed, speed),
            "agree": sum(out == run.result.new_ids for out, run in zip(outputs, plain))}


# ------------------------------------------------------------------- the conditions


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


def peak_memory(device: torch.device) -> dict:
    """The process's peak memory so far: largest allocation on CUDA, RSS high-water mark on CPU."""
    if device.type == "cuda":
        return {"what": "torch.cuda.max_memory_allocated", "bytes": torch.cuda.max_memory_allocated(device)}
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
                return {"what": "RSS high-water mark (VmHWM)", "bytes": int(line.split()[1]) * 1024}
    try:
        import resource  # not on Windows
    except ImportError:
        return {"what": "unknown", "bytes": None}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return {"what": "RSS high-water mark (getrusage)", "bytes": peak if sys.platform == "darwin" else peak * 1024}


def require(module: str, extra: str, why: str) -> None:
    """Refuse, before anything runs, an option whose optional dependency is missing."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{why} needs {module}, which is not installed (pip install -e '.[{extra}]')")


# ------------------------------------------------------------------------ the report


def per_prompt(row: Row, prompts: Sequence[BenchPrompt], oracle: Row | None) -> list[dict]:
    judged = row_degenerate_flags(row.runs, row.baseline, row.temperature)
    records = []
    for index, (prompt, run, plain, degenerate) in enumerate(zip(prompts, row.runs, row.baseline, judged)):
        fast, slow = run.result, plain.result
        record = {
            "index": index, "prompt": prompt.where, "prompt_tokens": len(prompt.ids),
            "new_tokens": fast.new_tokens, "distinct_4gram_ratio": distinct_ngram_ratio(fast.new_ids),
            "baseline_distinct_4gram_ratio": distinct_ngram_ratio(slow.new_ids), "degenerate": degenerate,
            "tau": fast.mean_acceptance, "tokens_per_second": fast.tokens_per_second,
            "baseline_tokens_per_second": slow.tokens_per_second,
            "speedup": ratio(fast.tokens_per_second, slow.tokens_per_second),
            "first_token_ms": 1000 * fast.first_token_seconds, "acceptance_lengths": fast.acceptance_lengths,
            "correct": run.correct, "baseline_correct": plain.correct,
        }
        if row.temperature == 0:
            record["identical_to_baseline"] = fast.new_ids == slow.new_ids
        if oracle is not None:
            record["oracle_tau"] = oracle.runs[index].result.mean_acceptance
            record["oracle_speedup"] = ratio(oracle.runs[index].result.tokens_per_second, slow.tokens_per_second)
        records.append(record)
    return records


def build_report(conditions: dict, prompts: Sequence[BenchPrompt], baselines: dict[float, list[Run]],
                 rows: Sequence[Row], memory: dict, peer: dict | None) -> dict:
    """Everything the run measured, as one JSON-ready object."""
    oracles = {row.block_size: row for row in rows if row.kind == "oracle"}
    report = {"conditions": conditions, "peak_memory": memory, "baselines": [], "rows": [], "peer": peer}
    for temperature, runs in baselines.items():
        flags = degenerate_flags(runs)
        report["baselines"].append({
            "temperature": temperature,
            "all": loop_figures(runs),
            "non_degenerate": loop_figures([run for run, flag in zip(runs, flags) if not flag]),
            "per_prompt": [{"index": index, "prompt": prompt.where, "new_tokens": run.result.new_tokens,
                            "tokens_per_second": run.result.tokens_per_second,
                            "first_token_ms": 1000 * run.result.first_token_seconds,
                            "distinct_4gram_ratio": distinct_ngram_ratio(run.result.new_ids), "degenerate": flag,
                            "correct": run.correct, "output_ids": run.result.new_ids}
                           for index, (prompt, run, flag) in enumerate(zip(prompts, runs, flags))],
        })
    for row in rows:
        oracle = oracles.get(row.block_size) if row.kind == "DFlash" and row.temperature == 0 else None
        report["rows"].append({
            "kind": row.kind, "block_size": row.block_size, "temperature": row.temperature,
            "degeneracy_judged_on": "the plain loop's output" if row.temperature == 0 else "either loop's output",
            **summarize_row(row.runs, row.baseline, row.temperature, row.block_size),
            "per_prompt": per_prompt(row, prompts, oracle),
        })
    for row in report["rows"]:
        chain = next((r for r in report["rows"] if r["kind"] == "DFlash" and r["block_size"] == row["block_size"]
                      and r["temperature"] == row["temperature"]), None)
        if row["kind"].startswith("tree") and chain is not None:
            for half in ("all", "non_degenerate"):
                row[half]["versus_chain"] = tree_versus_chain(row[half], chain[half])
    return report


def tree_versus_chain(tree: dict, chain: dict) -> dict:
    """A tree's figures over the chain's at the same block and temperature: tau, step cost and speed, as ratios."""
    if not tree["prompts"] or not chain["prompts"]:
        return {"tau": None, "step_cost": None, "speedup": None}
    return {"tau": ratio(tree["tau"], chain["tau"]),
            "step_cost": ratio(step_ms(tree["per_step_ms"]), step_ms(chain["per_step_ms"])),
            "speedup": ratio(tree["tokens_per_second"], chain["tokens_per_second"])}


def table(columns: Sequence[tuple[str, int, str]], rows: Sequence[Sequence], indent: str = "") -> str:
    """A right-aligned text table. Columns are (header, width, format spec); a spec ending in "x"
    marks a ratio ("1.73x"), and a missing value (None) prints as "-"."""

    def cell(value, width: int, spec: str) -> str:
        if value is None:
            return "-".rjust(width)
        text = format(value, spec[:-1]) + "x" if spec.endswith("x") else format(value, spec)
        return text.rjust(width)

    lines = [" ".join(header.rjust(width) for header, width, _ in columns)]
    lines += [" ".join(cell(value, width, spec) for value, (_, width, spec) in zip(row, columns)) for row in rows]
    return "\n".join(indent + line for line in lines)


def print_per_prompt(row: dict) -> None:
    print(f"\n{row['kind']}, block {row['block_size']}, temperature {row['temperature']:g}, per prompt "
          f"(degenerate: distinct-{NGRAM}-gram ratio < {DEGENERATE_BELOW}, judged on {row['degeneracy_judged_on']}):")
    oracle = "oracle_tau" in row["per_prompt"][0]
    columns = [("prompt", 6, "d"), (f"{NGRAM}-gram ratio: plain", 19, ".2f"), ("DFlash", 6, ".2f"),
               ("degenerate", 10, "s"), ("tau", 6, ".2f"), ("DFlash tok/s", 12, ".1f"), ("plain tok/s", 11, ".1f"),
               ("speedup", 8, ".2fx")] + ([("oracle tau", 10, ".2f")] if oracle else [])
    print(table(columns, [[p["index"], p["baseline_distinct_4gram_ratio"], p["distinct_4gram_ratio"],
                           "yes" if p["degenerate"] else "", p["tau"], p["tokens_per_second"],
                           p["baseline_tokens_per_second"], p["speedup"]] + ([p["oracle_tau"]] if oracle else [])
                          for p in row["per_prompt"]], indent="  "))
    if row["temperature"] == 0:
        same = sum(p["identical_to_baseline"] for p in row["per_prompt"])
        print(f"  greedy output identical to the plain loop's on {same}/{len(row['per_prompt'])} prompts")


def rows_by_temperature(report: dict):
    """(temperature, the plain loop's figures, the DFlash and oracle rows at that temperature), in run order."""
    for baseline in report["baselines"]:
        yield baseline, [row for row in report["rows"] if row["temperature"] == baseline["temperature"]]


def print_summary(report: dict) -> None:
    keys = ("prompts", "tau", "tokens_per_second", "speedup", "efficiency", "accuracy")
    half = [("prompts", 7, "d"), ("tau", 6, ".2f"), ("tok/s", 8, ".1f"), ("speedup", 8, ".2fx"),
            ("efficiency", 10, ".2f"), ("correct", 7, ".0%")]
    columns = [("temp", 4, "g"), ("block", 5, "s"), ("loop", 7, "s")] + half + [("|", 1, "s")] + half
    lines = []
    for baseline, rows in rows_by_temperature(report):
        for name, block, figures in [("plain", "-", baseline)] + [(r["kind"], str(r["block_size"]), r) for r in rows]:
            lines.append([baseline["temperature"], block, name, *(figures["all"].get(key) for key in keys), "|",
                          *(figures["non_degenerate"].get(key) for key in keys)])
    print(f"\nsummary (correct: replies whose last number is the prompt's answer)\n{'':19}{'all prompts':<52}"
          f"| non-degenerate prompts")
    print(table(columns, lines))


def print_phases(report: dict) -> None:
    print("\nwhere the time goes, all prompts, in ms. From the clean pass: the first token, and per token after it;\n"
          "from the timed pass, per step: draft, verify, decode, and accepting and bookkeeping (the rest)")
    columns = [("temp", 4, "g"), ("block", 5, "s"), ("loop", 7, "s"), ("1st token", 9, ".2f"), ("per token", 9, ".2f"),
               ("draft", 7, ".2f"), ("verify", 7, ".2f"), ("decode", 7, ".2f"), ("bookkeeping", 11, ".3f"),
               ("ideal speedup", 13, ".2fx")]
    lines = []
    for baseline, rows in rows_by_temperature(report):
        for name, block, figures in [("plain", "-", baseline)] + [(r["kind"], str(r["block_size"]), r) for r in rows]:
            a = figures["all"]
            steps = a.get("per_step_ms", {})
            lines.append([baseline["temperature"], block, name, a.get("first_token_ms"),
                          a.get("time_per_output_token_ms"), steps.get("draft"), steps.get("verify"),
                          steps.get("decode"), steps.get("accept_and_bookkeeping"), a.get("ideal_speedup")])
    print(table(columns, lines))


def print_trees(report: dict) -> None:
    """The chain and the trees at its block size, per temperature: what a tree buys (tau) and what it costs (a step)."""
    trees = [row for row in report["rows"] if row["kind"].startswith("tree")]
    if not trees:
        return
    block = trees[0]["block_size"]
    print(f"\nchain vs trees (block {block}), non-degenerate prompts: tau and its ratio to the chain's; the cost of "
          "a step\n(draft + verify + bookkeeping, ms) and its ratio; tokens/s; the speedup over the plain loop and "
          "over the chain")
    columns = [("temp", 4, "g"), ("loop", 7, "s"), ("prompts", 7, "d"), ("tau", 6, ".2f"), ("tau/chain", 9, ".2fx"),
               ("step ms", 7, ".2f"), ("step/chain", 10, ".2fx"), ("tok/s", 8, ".1f"), ("vs plain", 8, ".2fx"),
               ("vs chain", 8, ".2fx")]
    lines = []
    for row in report["rows"]:
        if not (row["kind"].startswith("tree") or (row["kind"] == "DFlash" and row["block_size"] == block)):
            continue
        figures = row["non_degenerate"]
        if not figures["prompts"]:
            continue
        versus_chain = figures.get("versus_chain", {"tau": 1.0, "step_cost": 1.0, "speedup": 1.0})
        lines.append([row["temperature"], "chain" if row["kind"] == "DFlash" else row["kind"], figures["prompts"],
                      figures["tau"], versus_chain["tau"], step_ms(figures["per_step_ms"]), versus_chain["step_cost"],
                      figures["tokens_per_second"], figures["speedup"], versus_chain["speedup"]])
    print(table(columns, lines))


def print_acceptance(report: dict) -> None:
    print("\nacceptance, all prompts: per draft slot k = 1..block-1, how often it was kept given slot k-1 was;\n"
          "the histogram of tokens per step 1..block")
    for row in report["rows"]:
        a = row["all"]
        rates = " ".join("   -" if rate is None else f"{rate:4.2f}" for rate in a.get("per_position_acceptance", []))
        print(f"  {row['kind']}, block {row['block_size']}, temperature {row['temperature']:g}:\n"
              f"    per slot   {rates}\n    histogram  {a.get('acceptance_histogram')}")


def print_report(report: dict) -> None:
    """The terminal tables: per prompt, the summary side by side, where the time goes, acceptance by slot."""
    for row in report["rows"]:
        if row["kind"] == "DFlash":
            print_per_prompt(row)
    print_summary(report)
    print_phases(report)
    print_trees(report)
    print_acceptance(report)
    memory = report["peak_memory"]
    if memory["bytes"] is not None:
        print(f"\npeak memory: {memory['bytes'] / 2**20:.0f} MiB ({memory['what']}, the whole process)")
    peer = report["peer"]
    if peer is not None:
        versus_peer = "-" if peer["plain_over_peer"] is None else f"{peer['plain_over_peer']:.2f}x"
        print(f"\n{peer['library']} {peer['version']} generate (greedy): {peer['tokens_per_second']:.1f} tok/s; "
              f"the plain loop {peer['plain_tokens_per_second']:.1f} tok/s = {versus_peer} that; "
              f"outputs agree on {peer['agree']}/{peer['prompts']} prompts")


def write_plots(folder: Path, report: dict) -> list[Path]:
    """Three PNGs: per-position acceptance, the acceptance histogram and the speedup per prompt, one curve per row."""
    import matplotlib  # the optional `plots` extra

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    rows = report["rows"]
    label = lambda row: f"{row['kind']}, B={row['block_size']}, T={row['temperature']:g}"  # noqa: E731
    written = []

    figure, axes = plt.subplots(figsize=(7, 4))
    for row in rows:
        rates = row["all"].get("per_position_acceptance", [])
        axes.plot(range(1, len(rates) + 1), [float("nan") if r is None else r for r in rates], marker="o",
                  label=label(row))
    axes.set(xlabel="draft slot k", ylabel="P(slot k kept | slot k-1 kept)", ylim=(0, 1.05),
             title="Per-position acceptance (all prompts)")
    axes.legend(fontsize=7)
    written.append(folder / "per_position_acceptance.png")

    figure2, axes2 = plt.subplots(len(rows), 1, figsize=(7, 2.2 * len(rows)), squeeze=False)
    for ax, row in zip(axes2[:, 0], rows):
        counts = row["all"].get("acceptance_histogram", [])
        steps = sum(counts) or 1
        ax.bar(range(1, len(counts) + 1), [c / steps for c in counts])
        ax.set(ylabel="share of steps", title=f"{label(row)}: tau {row['all'].get('tau') or 0:.2f}")
    axes2[-1, 0].set_xlabel("tokens accepted per step")
    written.append(folder / "acceptance_histogram.png")

    figure3, axes3 = plt.subplots(len(rows), 1, figsize=(8, 2.2 * len(rows)), squeeze=False)
    for ax, row in zip(axes3[:, 0], rows):
        speedups = [p["speedup"] or 0.0 for p in row["per_prompt"]]
        colours = ["tab:red" if p["degenerate"] else "tab:blue" for p in row["per_prompt"]]
        ax.bar(range(len(speedups)), speedups, color=colours)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(speedups)))
        ax.set(ylabel="speedup", title=f"{label(row)} (red: degenerate output)")
    axes3[-1, 0].set_xlabel("prompt")
    written.append(folder / "speedup_per_prompt.png")

    for fig, path in zip((figure, figure2, figure3), written):
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return written


# ------------------------------------------------------------------ the command line


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1] + "\n" + PROMPT_FORMAT,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash")
    p.add_argument("--prompts", type=Path, default=WEIGHTS / "heldout_problems.jsonl")
    p.add_argument("--block-sizes", type=int, nargs="+", default=None, help="default: the drafter's")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    p.add_argument("--trees", type=int, nargs="+", default=[], metavar="N",
                   help="also run draft trees of N nodes, at the largest block size, beside the chain")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    add_device_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on for CUDA, off for CPU")
    add_prompt_options(p)
    p.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the oracle (every draft right) at temperature 0: the ceiling (default: on)")
    p.add_argument("--peer", choices=["transformers"],
                   help="also time transformers' generate on the same target (needs the `peer` extra)")
    p.add_argument("--json", type=Path, help="also write everything to this file")
    p.add_argument("--plots", type=Path, metavar="DIR", help="also write PNG plots here (needs the `plots` extra)")
    return p


def run(args) -> int:
    if args.plots:
        require("matplotlib", "plots", "--plots")
    if args.peer:
        require(args.peer, "peer", f"--peer {args.peer}")
        if 0 not in args.temperatures:
            raise UsageError("--peer compares greedy outputs: include temperature 0 in --temperatures")
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype)
    tokenizer = find_tokenizer(args.model)
    prompts = [BenchPrompt(prompt.where, *encode_for_generation(prompt, tokenizer, args.chat, args.thinking,
                                                                args.token_healing), prompt.answer)
               for prompt in read_prompts(args.prompts)]
    block_sizes = args.block_sizes or [drafter.config.block_size]
    compile = device.type == "cuda" if args.compile is None else args.compile
    mode = "reduce-overhead" if compile and device.type == "cuda" else None
    # Room for the longest prompt, the output, the last block past it, and the oracle's longer truth.
    max_length = max(len(p.ids) for p in prompts) + args.max_new_tokens + 2 * max(block_sizes)
    runners = {b: ModelRunner(target, drafter, max_length=max_length, block_size=b, compile=compile, mode=mode)
               for b in block_sizes}
    if any(budget < 1 for budget in args.trees):
        raise UsageError(f"--trees takes budgets of at least 1 node, got {args.trees}")
    tree_runners = {n: ModelRunner(target, drafter, max_length=max_length + n + 1, block_size=max(block_sizes),
                                   tree_budget=n, compile=compile, mode=mode) for n in args.trees}
    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if tokenizer is not None else None
    loops = Loops(target, drafter, runners, stop_token_ids(args.model, tokenizer), args.seed, args.max_new_tokens,
                  tree_runners, decode)
    conditions = {
        "machine": machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "device": str(device), "dtype": str(dtype).removeprefix("torch."), "compile": compile, "batch_size": 1,
        "model": str(args.model), "draft": str(args.draft), "prompts_file": str(args.prompts),
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "block_sizes": block_sizes,
        "temperatures": args.temperatures, "seed": args.seed, "token_healing": args.token_healing,
        "tree_budgets": args.trees, "tree_block_size": max(block_sizes) if args.trees else None,
        "healed_prompts": sum(p.first_token_choices is not None for p in prompts),
        "degenerate": f"distinct-{NGRAM}-gram ratio of the new tokens < {DEGENERATE_BELOW}",
        "timing": "tokens/s and time to first token from a clean pass; per-step phases from a second, timed pass",
    }
    print("conditions:\n" + "\n".join(f"  {key.replace('_', ' ')}: {value}" for key, value in conditions.items()))
    conditions["warm_up_seconds"] = warm_up(loops, prompts[0], block_sizes, args.temperatures)
    baselines, rows = benchmark(loops, prompts, block_sizes, args.temperatures, args.oracle)
    memory = peak_memory(device)  # before the peer loads a second copy of the target
    peer = None
    if args.peer:
        progress(f"temperature 0: {args.peer} generate")
        peer = time_transformers(args.model, prompts, args.max_new_tokens, loops.stop_ids, device, dtype,
                                 baselines[0.0])
    report = build_report(conditions, prompts, baselines, rows, memory, peer)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plots:
        for path in write_plots(args.plots, report):
            print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
