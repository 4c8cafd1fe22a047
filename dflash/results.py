"""The record of a decoding call (tokens, acceptance per step, time) and the acceptance statistics over it.
`generate.py`'s `GenerationBuilder` fills it in as a loop commits tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

OnToken = Callable[[int, bool], None]  # (token id, came from an accepted draft)
TIMED_TOKENS = 64  # below this many new tokens, a speed is too noisy to report as one


def acceptance_histogram(acceptance_lengths: Sequence[int], block_size: int) -> list[int]:
    """How many steps accepted 1, 2, ..., block_size tokens."""
    return [list(acceptance_lengths).count(accepted) for accepted in range(1, block_size + 1)]


def slot_acceptance(histogram: Sequence[float]) -> list[float | None]:
    """Per draft slot k = 1..B-1, how often slot k was kept once reached, from how many steps committed 1, 2,
    ..., B tokens (a step of L tokens reaches slot k when k <= L and keeps it when k < L). None: never
    reached. The one place it is computed: the benchmarks' runs and training's held-out evaluation alike."""
    reached = [sum(histogram[slot - 1:]) for slot in range(1, len(histogram))]  # length >= k
    kept = [sum(histogram[slot:]) for slot in range(1, len(histogram))]  # length > k
    return [k / r if r else None for k, r in zip(kept, reached)]


def per_position_acceptance(acceptance_lengths: Sequence[int], block_size: int) -> list[float | None]:
    """`slot_acceptance` of the steps that committed `acceptance_lengths` tokens each."""
    return slot_acceptance(acceptance_histogram(acceptance_lengths, block_size))


@dataclass
class Generation:
    """What one call produced, and how fast. Each target pass after the prefill is a step, which committed
    `acceptance_lengths[i]` tokens (kept drafts + the target's own: 1 in the plain loop)."""

    new_ids: list[int]
    acceptance_lengths: list[int]
    seconds: float  # without the time spent in `on_token` (printing)
    callback_seconds: float = 0.0
    first_token_seconds: float = 0.0  # the prefill and the first sampling

    new_tokens = property(lambda self: len(self.new_ids))
    steps = property(lambda self: len(self.acceptance_lengths))
    tokens_per_second = property(lambda self: self.new_tokens / self.seconds if self.seconds > 0 else 0.0)
    mean_acceptance = property(lambda self: sum(self.acceptance_lengths) / self.steps if self.steps else 0.0)  # tau

    def histogram(self, block_size: int) -> list[int]:
        return acceptance_histogram(self.acceptance_lengths, block_size)

    def summary(self, name: str, block_size: int) -> str:
        """The CLI's lines for one loop: tokens and speed; for a speculative loop, its steps, tau and, on
        a line of its own, what its acceptance histogram counts."""
        line = (f"{name}: {self.new_tokens} new tokens in {self.seconds:.2f} s, "
                f"{self.tokens_per_second:.1f} tokens/s{self.too_short_note()}")
        if name == "baseline":
            return line
        return (f"{line}, {self.steps} steps, tau {self.mean_acceptance:.2f}{self.past_the_end_note()}\n"
                f"  acceptance histogram: of the {self.steps} steps, how many kept 1, 2, ..., {block_size} "
                f"tokens: {self.histogram(block_size)}")

    def too_short_note(self) -> str:
        """A mark on a speed measured over too few tokens to mean one: a short answer's time is mostly
        the prefill, the first steps and the clock's noise (the same run varies twofold)."""
        return f" (too few tokens to time: {TIMED_TOKENS} or more)" if self.new_tokens < TIMED_TOKENS else ""

    def report(self, text: str, baseline: Generation | None = None) -> dict:
        """The CLI's --json object: the output, its acceptance and speed, and the plain loop's beside it if run."""
        report = dict(output_ids=self.new_ids, text=text, acceptance_lengths=self.acceptance_lengths,
                      mean_acceptance=self.mean_acceptance, tokens_per_second=self.tokens_per_second,
                      new_tokens=self.new_tokens, steps=self.steps)
        if baseline is not None:
            report.update(baseline_output_ids=baseline.new_ids, baseline_tokens_per_second=baseline.tokens_per_second,
                          speedup=self.speedup_over(baseline))
        return report

    def speedup_over(self, baseline: Generation) -> float:
        return self.tokens_per_second / max(baseline.tokens_per_second, 1e-9)

    def past_the_end_note(self) -> str:
        """A note for tau when the last step accepted more than the output kept (it ran into the token limit or a
        stop token): tau counts that step whole, as the step happened, so it is above tokens per step."""
        cut = sum(self.acceptance_lengths) - (self.new_tokens - 1)  # the prefill's token is no step's
        tokens = "token" if cut == 1 else "tokens"
        return f" (with {cut} accepted {tokens} past the end of the output)" if cut > 0 else ""


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
