"""How a token is drawn from logits, and how a drafted token is judged against the target's: greedy, or sampled as
every official Qwen3 `generation_config.json` asks (temperature, top-k, top-p), with the min-p serving engines add."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from dflash.checkpoint import BOOLEAN, SIZE_LIMIT, check_fields, is_integer, is_number, read_json
from dflash.cli import non_negative
from dflash.errors import UsageError
from dflash.qwen3 import argmax


# A temperature under this is taken as 0 (greedy): that cold, a draw is the argmax but for exact
# ties, and float32 logits divided by 1e-39 overflow to inf (by 1e-46, float32's 0: NaN), garbage.
GREEDY_BELOW = 1e-8


# A top-k past any vocabulary's size keeps them all, as 0 does; one past 64 bits cannot even be
# printed as a float (`Sampling.filters`).
TOP_K = (f"an integer in 0..{SIZE_LIMIT} (0: no limit)",
         lambda value: is_integer(value) and 0 <= value <= SIZE_LIMIT)


@dataclass(frozen=True)
class Sampling:
    """Argmax at temperature 0, else a draw from the tempered softmax cut down by top-k, then top-p, then min-p."""

    temperature: float = 0.0
    top_k: int = 0  # keep the k likeliest tokens (0: all)
    top_p: float = 1.0  # keep the likeliest tokens until their probabilities sum to top_p
    min_p: float = 0.0  # keep the tokens at least min_p times as likely as the likeliest

    def __post_init__(self):
        if not 0 <= self.temperature < math.inf:  # nan fails every comparison
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature < GREEDY_BELOW:  # see GREEDY_BELOW: no draw, but the argmax
            object.__setattr__(self, "temperature", 0.0)
        if not TOP_K[1](self.top_k):
            raise UsageError(f"top-k must be {TOP_K[0]}, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise UsageError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> str:
        """The filters in use, as tables name them: `k20 p0.8`, or '' for none."""
        named = (("k", self.top_k, 0), ("p", self.top_p, 1.0), ("min_p", self.min_p, 0.0))
        return " ".join(f"{name}{value:g}" for name, value, off in named if value != off)

    def __str__(self) -> str:
        return f"T={self.temperature:g} {self.filters}".rstrip()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (..., vocab) a token is drawn from, in float64 (exact sums over 150,000 tokens)."""
        probs = tempered_softmax(logits, self.temperature)  # (..., vocab)
        if self.top_k:
            kth = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
            probs.masked_fill_(probs < kth, 0.0)  # in place: each (..., vocab) temporary costs a pass over memory
        if self.top_p < 1:
            probs = self.nucleus(probs)
        if self.min_p:
            probs.masked_fill_(probs < self.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        return probs.div_(probs.sum(dim=-1, keepdim=True))

    def nucleus(self, probs: torch.Tensor) -> torch.Tensor:
        """`probs` (..., vocab) with only the likeliest tokens whose mass reaches top_p of the total. Ranking the whole
        vocabulary is the slow part of sampling; the kept tokens are few, so only the likeliest `ranks` are ranked,
        ever more of them until every row drops its last: the mass above a rank only grows, so no later one is kept.
        Each round asks the host whether to go on: on a GPU, a sync."""
        threshold = self.top_p * probs.sum(dim=-1, keepdim=True)  # (..., 1)
        ranks = min(self.top_k or 64, probs.shape[-1])
        while True:
            ranked, order = probs.topk(ranks, dim=-1)  # (..., ranks) each, likeliest first
            kept = ranked.cumsum(dim=-1) - ranked < threshold  # the mass of the tokens ranked above each one
            if ranks == probs.shape[-1] or not kept[..., -1].any():
                return torch.zeros_like(probs).scatter_(-1, order, ranked.where(kept, 0.0))
            ranks = min(4 * ranks, probs.shape[-1])


GREEDY = Sampling()  # the argmax: every loop's default


def tempered_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) (..., vocab), computed in float32 and returned in float64. The sums that follow
    over 150,000 tokens (the filters', `draw`'s running sum) need float64: a float32 running sum rounds most of the
    tail's intervals to nothing. The softmax does not: each probability is off by about 1e-7 of itself, no more than
    the float32 logits carry, and at Qwen3's vocabulary a CPU runs it in about half the time of a float64 one
    (benchmarks/step_overheads.py)."""
    return torch.softmax(logits.float() / temperature, dim=-1).double()


def as_sampling(sampling: Sampling | float) -> Sampling:
    """A bare number is a temperature: `sample(logits, 0.7)` reads as it should."""
    return sampling if isinstance(sampling, Sampling) else Sampling(sampling)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probabilities (..., vocab) -> (...), by inverse-CDF sampling: exact (a token of
    probability 0 adds nothing to the running sum, so is never picked) and on the CPU cheaper than multinomial."""
    running = probs.cumsum(dim=-1)  # (..., vocab)
    u = torch.rand(running.shape[:-1] + (1,), dtype=running.dtype, device=running.device, generator=generator)
    picks = torch.searchsorted(running, u * running[..., -1:], right=True)  # (..., 1): first running sum > u
    return picks.squeeze(-1).clamp_(max=probs.shape[-1] - 1)  # (...); the clamp guards a u rounded up to the sum


def sample(logits: torch.Tensor, sampling: Sampling | float = 0.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits (..., vocab) -> (...). Both loops draw through here, so the
    speculative loop samples from exactly the distribution the plain loop samples from."""
    sampling = as_sampling(sampling)
    return argmax(logits) if sampling.greedy else draw(sampling.probs(logits), generator)


def keep_only(logits: torch.Tensor, allowed: Sequence[int]) -> torch.Tensor:
    """Logits (..., vocab) with every token outside `allowed` at -inf: token healing's first token."""
    mask = torch.full_like(logits, float("-inf"))
    mask[..., list(allowed)] = 0.0
    return logits + mask


def verdicts(target_probs: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
             generator: torch.Generator | None) -> torch.Tensor:
    """The token the target commits after each slot (block,); a draft is kept where it equals it. Rejection sampling,
    so every committed token follows the target's p: a greedy draft d is kept when the target's own draw is d; one
    drawn from the drafter's q (the first `len(draft_probs)` slots) with probability min(1, p(d)/q(d)), else a draw
    from max(0, p - q) replaces it."""
    tokens = draw(target_probs, generator)  # (block,): the target's own draw after every slot
    if draft_probs is None:
        return tokens
    n = draft_probs.shape[0]  # the sampled slots
    guess = drafts[:n, None]  # (n, 1)
    p_target, q_draft = target_probs[:n].gather(1, guess)[:, 0], draft_probs.gather(1, guess)[:, 0]  # (n,) each
    keep = torch.rand(n, dtype=q_draft.dtype, device=q_draft.device, generator=generator) * q_draft < p_target
    residual = draw((target_probs[:n] - draft_probs).clamp_(min=0.0), generator)  # (n,)
    tokens[:n] = torch.where(keep, drafts[:n], residual)
    return tokens


def sampled_slots(policy: str, block_size: int, sampling: Sampling) -> int:
    """How many leading draft slots `policy` samples from the drafter (the rest are its argmax)."""
    name, _, count = policy.partition(":")
    mixed = name == "mixed" and count.isdigit() and 1 <= int(count) < block_size
    if policy not in ("greedy", "sampled") and not mixed:  # unknown comes first: a typo is a typo
        raise UsageError(f"draft policy must be greedy, sampled or mixed:K with 1 <= K < "
                         f"{block_size}, got {policy!r}")
    if policy == "greedy":
        return 0
    if sampling.greedy:
        raise UsageError(f"draft policy {policy!r} samples drafts, which needs a temperature above 0")
    return block_size - 1 if policy == "sampled" else int(count)


def known_draft_policy(text: str) -> str:
    """An argparse type: greedy, sampled or mixed:K with K >= 1 (whether K fits the block is for
    `sampled_slots` to say, once the block size is known)."""
    name, _, count = text.partition(":")
    if text in ("greedy", "sampled") or (name == "mixed" and count.isdigit() and int(count) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"unknown draft policy {text!r} (greedy, sampled or "
                                     "mixed:K with K >= 1)")


def add_sampling_options(parser: argparse.ArgumentParser, draft_policy: bool = True) -> None:
    """How tokens are drawn, alike in generate.py, bench.py and make_data.py (which drafts nothing).
    The four numbers default to None, "not given", so that one given explicitly wins over
    `--sample-from-config` (`sampling_of`)."""
    add = parser.add_argument
    add("--temperature", type=non_negative, help=f"0 = greedy (the default); one under "
        f"{GREEDY_BELOW:g} counts as 0 (that cold a draw is the argmax, and float32 cannot divide "
        "by much less)")
    add("--top-k", type=int, help="sample among the k likeliest tokens only (default 0: all)")
    add("--top-p", type=float, help="sample among the likeliest tokens that sum to p (default 1)")
    add("--min-p", type=float, help="drop tokens under min-p times the top probability (default 0)")
    add("--sample-from-config", action="store_true", help="take temperature, top-k, top-p and "
        "min-p from the model's generation_config.json; any of the four options given as well wins "
        "over the file's value")
    if draft_policy:
        add("--draft-policy", type=known_draft_policy, default="greedy",
            metavar="greedy|sampled|mixed:K", help="above temperature 0: draft the drafter's "
            "argmax (default), sample every slot from it, or sample the first K slots")


# The fields of `generation_config.json` that say how to sample, and what each must be.
GENERATION_FIELD_RULES = {
    "do_sample": BOOLEAN, "top_k": TOP_K,
    "temperature": ("a finite number >= 0", lambda value: is_number(value) and value >= 0),
    "top_p": ("a number in (0, 1]", lambda value: is_number(value) and 0 < value <= 1),
    "min_p": ("a number in [0, 1]", lambda value: is_number(value) and 0 <= value <= 1)}


def generation_config(model: Path) -> dict:
    """The sampling fields of a checkpoint's `generation_config.json`, checked; a null field counts as unset."""
    path = Path(model) / "generation_config.json"
    config = read_json(path, UsageError)
    if not isinstance(config, dict):
        raise UsageError(f"{path}: expected a JSON object")
    fields = {name: config[name] for name in GENERATION_FIELD_RULES if config.get(name) is not None}
    check_fields(fields, GENERATION_FIELD_RULES, path, UsageError)
    return fields


def sampling_of(args, model: Path) -> Sampling:
    """The `Sampling` the options ask for. `--sample-from-config` starts from what the checkpoint
    recommends (greedy when its do_sample is not true); an option given explicitly wins over its
    field."""
    names = ("temperature", "top_k", "top_p", "min_p")
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if not args.sample_from_config:
        return Sampling(**given)
    config = generation_config(model)
    recommended = {name: config[name] for name in names if name in config}
    if not config.get("do_sample", False):  # the checkpoint recommends greedy decoding: no filters
        recommended = {"temperature": 0.0}
    return Sampling(**{"temperature": 1.0, **recommended, **given})
