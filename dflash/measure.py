"""Measuring the loops, for the benchmarks and the notebooks alike: a loop run on a prompt set,
timed per phase (`Loops`, `Run`, `PhaseClock`), the oracle that drafts the right answer, reply
checks (repetition, the final number) and the figures a row of loops reduces to (tau, speedup, the
ideal speedup the pass costs allow).

The loops themselves are `generate.py`'s: `Loops` is handed that module, since the package never
imports a script.
"""

from __future__ import annotations

import re
import time
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Sequence

import torch

from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.results import Generation, per_position_acceptance, synchronize
from dflash.sampling import Sampling, as_sampling


def distinct_ngram_ratio(ids: Sequence[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams: 1.0 when nothing repeats (or nothing can: under n ids), near
    0 for a loop."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def final_number(text: str) -> str | None:
    """The last integer in a reply ("... The answer is 42." -> "42"): what answer checks compare."""
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


DEGENERATE_BELOW = 0.3  # an output whose distinct-4-gram ratio is below this is degenerate


def is_degenerate(ids: Sequence[int]) -> bool:
    return distinct_ngram_ratio(ids) < DEGENERATE_BELOW


def accuracy(runs: Sequence[Run]) -> float | None:
    """The share of correct replies among the runs whose prompt has a known answer (None: none)."""
    checked = [run.correct for run in runs if run.correct is not None]
    return sum(checked) / len(checked) if checked else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def ideal_speedup(tokens_per_step: float, t_decode: float, t_draft: float,
                  t_verify: float) -> float | None:
    """The plain loop pays t_decode per token; DFlash pays t_draft + t_verify per step of
    `tokens_per_step` tokens."""
    return (None if None in (tokens_per_step, t_decode, t_draft, t_verify)
            else ratio(tokens_per_step * t_decode, t_draft + t_verify))


def efficiency(speedup: float, tokens_per_step: float, t_decode: float, t_draft: float,
               t_verify: float) -> float | None:
    """Measured speedup / ideal speedup: the share of what the accepted drafts promise that the loop
    delivers."""
    return ratio(speedup, ideal_speedup(tokens_per_step, t_decode, t_draft, t_verify))


def step_ms(per_step_ms: dict[str, float | None] | None) -> float | None:
    """The cost of one step: its phases added up, None if one is missing."""
    return None if not per_step_ms or None in per_step_ms.values() else sum(per_step_ms.values())


# A prompt for the loops: "file:line", ids, token healing's first-token choices, the answer (the
# reply's last number).
BenchPrompt = namedtuple("BenchPrompt", "where ids first_token_choices answer",
                         defaults=(None, None))


@dataclass
class Run:
    """One loop on one prompt: the clean pass (the speed), the timed pass and its phases (where the
    time goes)."""

    result: Generation
    timed: Generation
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phase_calls: dict[str, int] = field(default_factory=dict)
    correct: bool | None = None  # the reply's last number is the prompt's answer (None: unknown)

    @property
    def bookkeeping_seconds(self) -> float:
        """Outside the prefill and the phases: accepting, committing, trimming."""
        timed = self.timed
        return timed.seconds - timed.first_token_seconds - sum(self.phase_seconds.values())


class PhaseClock:
    """Times a runner's phases (`Timed`): the seconds and calls of each, waiting for the GPU before
    each reading."""

    def __init__(self, device: torch.device, phases: Sequence[str]):
        self.device = device
        self.seconds, self.calls = dict.fromkeys(phases, 0.0), dict.fromkeys(phases, 0)

    @contextmanager
    def __call__(self, phase: str):
        synchronize(self.device)
        began = time.perf_counter()
        yield
        synchronize(self.device)
        self.seconds[phase] += time.perf_counter() - began
        self.calls[phase] += 1


class Wrapped:
    """A runner seen through a wrapper: every attribute is the runner's but what the wrapper
    defines. Benchmarks time or steer a runner this way, from outside: the runner itself is never
    changed."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name: str):
        return getattr(self.runner, name)


# The runner's methods a loop calls, by the phase of a step they run.
PHASES = {"decode": "decode", "draft": "draft", "draft_sampled": "draft", "draft_tree": "draft",
          "verify": "verify", "verify_sampled": "verify", "verify_tree": "verify"}


class Timed(Wrapped):
    """A runner whose passes `clock` times (`with clock(phase):` around each call a loop makes)."""

    def __init__(self, runner, clock: Callable):
        super().__init__(runner)
        self.clock = clock

    def __getattr__(self, name: str):
        method = getattr(self.runner, name)
        if name not in PHASES:
            return method

        def timed(*args, **options):
            with self.clock(PHASES[name]):
                return method(*args, **options)
        return timed


class Oracle(Wrapped):
    """A runner whose drafts are `truth` (n,), the prompt and its greedy continuation, so every
    block is kept: the ceiling. The real draft pass still runs, for its cost and to keep the
    drafter's cache in step; its logits are then replaced by ones that put all weight on the truth.
    With no truth (the warm-up) it drafts as the runner does."""

    def __init__(self, runner, truth: torch.Tensor | None = None):
        super().__init__(runner)
        self.truth = truth

    def draft(self, features: torch.Tensor, last_token: int) -> torch.Tensor:
        logits = self.runner.draft(features, last_token)  # (block - 1, vocab)
        if self.truth is None:
            return logits
        start = self.runner.target_cache.length  # of `last_token`
        return certain_logits(self.truth[start + 1:start + self.runner.block_size],
                              logits.shape[-1])


def certain_logits(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits (n, vocab) whose argmax, and only likely token, is `tokens` (n,)."""
    logits = torch.full((len(tokens), vocab), float("-inf"), device=tokens.device)
    return logits.scatter_(1, tokens[:, None], 0.0)  # (n, vocab)


@dataclass
class Loops:
    """The loops ("plain", "DFlash", "tree N", "oracle"), bound to what every call shares; a runner
    each. `engine` is the module that holds them, `generate` (passed in: the package never imports
    a script)."""

    target: Qwen3
    drafter: Drafter
    stop_ids: list[int]
    seed: int
    max_new_tokens: int
    max_length: int  # the longest prompt, the output, and room for the oracle's truth
    runner_options: dict = field(default_factory=dict)  # compile, mode
    decode: Callable[[list[int]], str] | None = None  # ids -> text, to check replies' answers
    runners: dict[tuple[str, int | None], object] = field(default_factory=dict)
    engine: ModuleType = field(kw_only=True)

    def runner(self, kind: str, block_size: int | None):
        """A loop's `ModelRunner` (the oracle's wrapped in `Oracle`), built on first use: its caches
        and buffers then serve every call."""
        if (kind, block_size) not in self.runners:
            budget = int(kind.removeprefix("tree ")) if kind.startswith("tree ") else 0
            runner = self.engine.ModelRunner(self.target, None if kind == "plain" else self.drafter,
                                             block_size=block_size, tree_budget=budget,
                                             max_length=self.max_length + budget + 1,
                                             **self.runner_options)
            self.runners[kind, block_size] = Oracle(runner) if kind == "oracle" else runner
        return self.runners[kind, block_size]

    def generate(self, kind: str, block_size: int | None, prompt: BenchPrompt,
                 temperature: float | Sampling, max_new_tokens: int | None = None, *,
                 stop: bool = True, policy: str = "greedy",
                 clock: PhaseClock | None = None) -> Generation:
        """One call of a loop, with the seed, limit and first-token choices of every other; its
        phases timed by `clock`, if given."""
        runner, device = self.runner(kind, block_size), self.target.embed_tokens.weight.device
        options = dict(sampling=as_sampling(temperature), stop_ids=self.stop_ids if stop else (),
                       generator=torch.Generator(device).manual_seed(self.seed),
                       runner=runner if clock is None else Timed(runner, clock),
                       first_token_choices=prompt.first_token_choices)
        args = (prompt.ids, max_new_tokens or self.max_new_tokens)
        if kind == "plain":
            return self.engine.generate_autoregressive(self.target, *args, **options)
        if kind.startswith("tree "):
            return self.engine.generate_dflash_tree(self.target, self.drafter, *args,
                                                    budget=int(kind[5:]), **options)
        return self.engine.generate_dflash(self.target, self.drafter, *args, block_size=block_size,
                                           draft_policy=policy, **options)

    def measure(self, kind: str, block_size: int | None, prompt: BenchPrompt,
                temperature: float | Sampling, truth: list[int] | None = None,
                policy: str = "greedy") -> Run:
        """Run a loop twice, clean then phase-timed; check the reply. The oracle drafts `truth`,
        the greedy reply."""
        device = self.target.embed_tokens.weight.device
        if kind == "oracle":  # the wrapper's truth: the runner itself is not changed
            self.runner(kind, block_size).truth = torch.tensor(prompt.ids + truth, device=device)
        result = self.generate(kind, block_size, prompt, temperature, policy=policy)
        phases = ["decode"] if kind == "plain" else ["draft", "verify"]
        clock = PhaseClock(device, phases)
        timed = self.generate(kind, block_size, prompt, temperature, policy=policy, clock=clock)
        correct = (final_number(self.decode(result.new_ids)) == prompt.answer
                   if prompt.answer and self.decode else None)
        return Run(result, timed, clock.seconds, clock.calls, correct)


def loop_figures(runs: Sequence[Run], block_size: int | None = None) -> dict:
    """One loop's figures over some prompts, its clean passes pooled into one `Generation`; times
    in ms."""
    if not runs:
        return {"prompts": 0}
    pooled = Generation([t for run in runs for t in run.result.new_ids],
                        [n for run in runs for n in run.result.acceptance_lengths],
                        sum(run.result.seconds for run in runs),
                        first_token_seconds=sum(run.result.first_token_seconds for run in runs))
    phases = {name: sum(run.phase_seconds[name] for run in runs) for name in runs[0].phase_seconds}
    phases["accept_and_bookkeeping"] = sum(run.bookkeeping_seconds for run in runs)
    steps = sum(run.timed.steps for run in runs)
    after_first = pooled.seconds - pooled.first_token_seconds
    figures = {"prompts": len(runs), "new_tokens": pooled.new_tokens, "steps": pooled.steps,
               "accuracy": accuracy(runs), "tau": pooled.mean_acceptance if pooled.steps else None,
               # the prefill's token is no step's
               "tokens_per_step": ratio(pooled.new_tokens - len(runs), pooled.steps),
               "tokens_per_second": ratio(pooled.new_tokens, pooled.seconds),
               "first_token_ms": 1000 * pooled.first_token_seconds / len(runs),
               "time_per_output_token_ms": ratio(1000 * after_first, pooled.new_tokens - len(runs)),
               "per_step_ms": {name: ratio(1000 * seconds, steps)
                               for name, seconds in phases.items()}}
    if block_size is not None:
        figures.update(acceptance_histogram=pooled.histogram(block_size),
                       per_position_acceptance=per_position_acceptance(pooled.acceptance_lengths,
                                                                       block_size))
    return figures


def left_out(runs: Sequence[Run], baseline: Sequence[Run], temperature: float) -> list[bool]:
    """Per prompt, whether the non-degenerate figures leave it out: one prompt set for both sides of
    a speedup."""
    return [is_degenerate(plain.result.new_ids)
            or (temperature > 0 and is_degenerate(run.result.new_ids))
            for run, plain in zip(runs, baseline)]


def summarize_row(runs: Sequence[Run], baseline: Sequence[Run], temperature: float,
                  block_size: int | None) -> dict:
    """A loop against the plain one, over all prompts and the non-degenerate ones (speedup: prefill
    included)."""
    summary = {}
    for half, out in (("all", [False] * len(runs)),
                      ("non_degenerate", left_out(runs, baseline, temperature))):
        fast = loop_figures([run for run, o in zip(runs, out) if not o], block_size)
        plain = loop_figures([run for run, o in zip(baseline, out) if not o])
        speedup = ratio(fast.get("tokens_per_second"), plain.get("tokens_per_second"))
        costs = (fast.get("tokens_per_step"), plain.get("per_step_ms", {}).get("decode"),
                 *map(fast.get("per_step_ms", {}).get, ("draft", "verify")))
        summary[half] = {**fast, "baseline": plain, "speedup": speedup,
                         "ideal_speedup": ideal_speedup(*costs),
                         "efficiency": efficiency(speedup, *costs),
                         "decode_speedup": ratio(plain.get("time_per_output_token_ms"),
                                                 fast.get("time_per_output_token_ms"))}
    return summary
