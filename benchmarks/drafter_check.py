"""Why a drafter accepts less than it should: what its training log claimed, what it does here, and which of the
usual convention errors between a trainer and a server it actually fits.

    python benchmarks/drafter_check.py --model weights/tiny-qwen3 --draft weights/tiny-qwen3-dflash \
        --prompts weights/handwritten_problems.jsonl --max-new-tokens 64

Drafters that were 98 % right in training and 10 % right when served have, in the reports behind this check, one
of a few bugs: the target's layers counted from the embeddings on one side and not the other (every feature one
layer off), labels shifted by one as a causal LM shifts them (slot k learnt the token after its own), another mask
token. Each leaves the weights fine and the served drafts wrong, so this check does not ask whether the drafter is
good, but which convention it was trained under: the target answers the prompts (greedy, through real speculative
decoding, which also gives the served acceptance), then the drafter drafts a block at every position of those
answers, once per convention, and each convention is scored by the acceptance it would give (teacher-forced: the
context is always the target's own text). The convention with the clearly highest score is the one the drafter
fits; the configured one winning means no convention error. Conventions are tried one at a time, not combined.

A drafter that fits its conventions and still accepts less here than its log claims is meeting prompts unlike its
training data (another mode or domain): fine-tune it on the target's answers to such prompts (docs/training.md).

With --engine-acceptance FILE, the per-position acceptance a serving engine reported (pasted
as JSON, see ENGINE_SHAPES) is set beside the log's per-slot figures and what is served here,
and the first position where the engine falls clearly below the log is named. The check also
lists every field of the drafter's config.json that vLLM or SGLang would read otherwise than
the drafter was trained (benchmarks/engine_fields.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from dflash.checkpoint import (is_integer, parse_json, read_json, read_side_file,
                              read_text)
from bench_common import check_report_output, write_report
from dflash.cli import (OneLineErrors, UsageError, add_device_options,
                        check_token_ids, int_list, pick_device, pick_dtype, positive_int, run_cli)
from dflash.drafter import Drafter
from engine_fields import engine_field_problems
from dflash.prompts import (PROMPT_FORMAT, add_prompt_options, check_prompt_options,
                            encode_for_generation, read_prompts)
from dflash.qwen3 import Qwen3
from dflash.results import per_position_acceptance
from dflash.tokenizer import END_OF_TEXT, find_tokenizer, stop_token_ids
from dflash.train_kernels import AnchoredBlocks
from dflash.training import estimated_tau
from generate import generate_dflash

# A convention is named only when its score beats the configured one's by this factor. A drafter scores highest
# under the convention it was trained with, so a small lead already says which; but a neighbouring layer's features
# are alike (on the demo pair one layer off costs 10-15 % of tau), and two unused embedding rows as mask tokens tie.
CLEARLY_BETTER = 1.05


@dataclass(frozen=True)
class Convention:
    """One way of feeding and scoring the drafter: the target layers its features come from, which token slot k
    is scored against (x_{a+k+label_shift}), and the token in the unknown slots."""

    name: str
    layer_ids: tuple[int, ...]
    label_shift: int
    mask_token_id: int
    diagnosis: str  # what it means when this convention fits best


def conventions_to_try(drafter: Drafter, num_target_layers: int, mask_tokens: Sequence[int]) -> list[Convention]:
    """The configured convention first, then each usual error alone: layers shifted by one either way (where the
    target has them), labels shifted by one either way, every other candidate mask token."""
    config = drafter.config
    ids, mask = tuple(config.target_layer_ids), config.mask_token_id
    tried = [Convention("as configured", ids, 0, mask, "no convention error: the drafter fits its own config")]
    for shift in (-1, +1):
        shifted = tuple(layer + shift for layer in ids)
        if all(0 <= layer < num_target_layers for layer in shifted):
            tried.append(Convention(
                f"target layer ids {shift:+d}", shifted, 0, mask,
                f"target layer ids off by one: the drafter was trained on the outputs of layers {list(shifted)}, "
                f"its config says {list(ids)} (one side counts the embeddings as layer 0); set "
                f"dflash_config.target_layer_ids to {list(shifted)}"))
    for shift, how in ((-1, "each label taken one position early"), (+1, "a causal LM's label shift applied to a "
                                                                          "block")):
        tried.append(Convention(
            f"labels {shift:+d} slot", ids, shift, mask,
            f"labels shifted by {shift:+d} slot: slot k was trained to predict x_(a+k{shift:+d}), not x_(a+k) "
            f"({how}); retrain with each slot labelled by its own position"))
    for other in mask_tokens:
        if other != mask:
            tried.append(Convention(
                f"mask token {other}", ids, 0, other,
                f"another mask token: the drafter was trained with {other} in its unknown slots, its config says "
                f"{mask}; set dflash_config.mask_token_id to {other}"))
    return tried


def candidate_mask_tokens(target: Qwen3, tokenizer, extra: Sequence[int] = ()) -> list[int]:
    """Mask tokens a trainer plausibly used: the tokenizer's <|mask|>, the first id past the tokenizer (the released
    drafters'), the last embedding row, the pad token <|endoftext|> (taken for the mask by mistake), and any given;
    only ids the target has an embedding for."""
    vocab = target.config.vocab_size
    pad = tokenizer.token_to_id(END_OF_TEXT) if tokenizer is not None else None
    found = [getattr(tokenizer, "mask_token_id", None), getattr(tokenizer, "vocab_size", None), vocab - 1, pad, *extra]
    return [token for token in dict.fromkeys(found) if token is not None and 0 <= token < vocab]


@dataclass
class Score:
    """A convention's teacher-forced result over all anchors: tau (1 + the mean leading run of right drafts) and
    each slot's accuracy on its own, as train.py logs it."""

    tau: float
    slot_accuracy: list[float]
    tau_estimate: float  # train.py's estimate from the slot accuracies, to set beside the log's


def drafts_at_every_anchor(target: Qwen3, drafter: Drafter, input_ids: torch.Tensor, by_layer: torch.Tensor,
                           anchors: torch.Tensor, convention: Convention) -> torch.Tensor:
    """The drafter's guesses (K, B) for a block at each anchor a, fed under `convention` as train.py feeds it: the
    features of its layers before a, [x_a, MASK, ...] at a..a+B-1, every block in one pass."""
    block, length, device = drafter.config.block_size, input_ids.shape[1], input_ids.device
    features = by_layer[:, :, list(convention.layer_ids)].flatten(2)  # (1, S, layers, hidden) -> (1, S, layers * hidden)
    block_ids = torch.full((len(anchors), block), convention.mask_token_id, device=device)  # (K, B)
    block_ids[:, 0] = input_ids[0, anchors]
    positions = (anchors[:, None] + torch.arange(block, device=device)).flatten()[None]  # (K, B) -> (1, K*B)
    pattern = AnchoredBlocks(anchors[None], length, block)
    hidden = drafter(features, target.embed_tokens(block_ids.flatten()[None]),  # (1, K*B, hidden)
                     torch.arange(length, device=device), positions, attend=pattern.attend)
    return target.logits(hidden).argmax(-1).view(len(anchors), block)  # (1, K*B) -> (K, B)


@torch.no_grad()
def teacher_forced(target: Qwen3, drafter: Drafter, sequences: Sequence[tuple[list[int], int]],
                   conventions: Sequence[Convention]) -> dict[str, Score]:
    """Draft at every answer position of every (ids, prompt length) under each convention; score slot k against
    x_(a+k+label_shift): the run of right drafts before the first miss, and each slot's hits."""
    block, device = drafter.config.block_size, target.embed_tokens.weight.device
    runs = dict.fromkeys((c.name for c in conventions), 0)  # right drafts before the first miss, summed over anchors
    hits = {c.name: torch.zeros(block, device=device) for c in conventions}  # (B,) right drafts per slot
    counts = {c.name: torch.zeros(block, device=device) for c in conventions}  # (B,) scored drafts per slot
    every_layer = list(range(target.config.num_hidden_layers))
    for ids, prompt_length in sequences:
        length = len(ids)
        anchors = torch.arange(prompt_length, length - 1, device=device)  # (K,): the first is the prefill's token
        if not len(anchors):
            continue
        input_ids = torch.tensor([ids], device=device)  # (1, S)
        used = max(layer for c in conventions for layer in c.layer_ids)
        _, captured = target(input_ids, capture_layers=every_layer[:used + 1], last_layer=used)  # (1, S, L' * hidden)
        by_layer = captured.unflatten(-1, (used + 1, -1))  # (1, S, L', hidden): layer l's output at [:, :, l]
        slots = anchors[:, None] + torch.arange(block, device=device)  # (K, B): the positions the block occupies
        for convention in conventions:
            guesses = drafts_at_every_anchor(target, drafter, input_ids, by_layer, anchors, convention)  # (K, B)
            wanted_at = slots + convention.label_shift  # (K, B)
            scored = (wanted_at >= 0) & (wanted_at < length)
            scored[:, 0] = False  # slot 0 is the known token
            right = scored & (guesses == input_ids[0, wanted_at.clamp(0, length - 1)])  # (K, B)
            runs[convention.name] += right[:, 1:].int().cumprod(dim=1).sum().item()  # (K, B-1) -> runs summed
            hits[convention.name] += right.sum(0)
            counts[convention.name] += scored.sum(0)
    anchors_seen = max(1, sum(max(0, len(ids) - 1 - prompt_length) for ids, prompt_length in sequences))
    return {name: Score(1.0 + runs[name] / anchors_seen,
                        [round(a, 4) for a in (hits[name][1:] / counts[name][1:].clamp(min=1)).tolist()],
                        estimated_tau(hits[name], counts[name])) for name in runs}


def training_log_claim(drafter_folder: Path) -> dict | None:
    """What the drafter's train_log.jsonl claimed at its last step: slot accuracy, tau estimate, the last eval tau
    (train.py's log; None when the folder has none, as the authors' releases do not, or when it is not as train.py
    writes it: then one note says why, and the check goes on without it). A line cut by a killed run is not counted."""
    records = read_side_file(drafter_folder / "train_log.jsonl", "training log", log_problem, lines=True)
    records = [record for _, record in records or ()]
    if not records or records[-1].get("slot_accuracy") is None:
        return None
    evaluated = [record["eval_tau"] for record in records if record.get("eval_tau") is not None]
    claim = {"step": records[-1]["step"], "slot_accuracy": records[-1]["slot_accuracy"],
             "tau_estimate": records[-1].get("tau_estimate"),
             "eval_tau": evaluated[-1] if evaluated else None}
    for name in ("eval_slot_acceptance", "heldout_slot_accuracy"):  # at evaluations: the last
        logged = [record[name] for record in records if record.get(name) is not None]
        claim[name] = logged[-1] if logged else None
    return claim


# What each figure of a training log this check reads must be, when given (null: not logged at that step).
# Compared, never converted: a number of 400 digits is simply out of range, not an overflow.
LOG_FIELD_RULES = {
    "step": ("an integer >= 0", lambda value: is_integer(value) and value >= 0),
    "tau_estimate": ("a number in 0..2**31", lambda value: is_between(value, 0, 2**31)),
    "eval_tau": ("a number in 0..2**31", lambda value: is_between(value, 0, 2**31)),
    "slot_accuracy": ("a list of rates in 0..1", lambda value: are_rates(value, gaps=False)),
    "heldout_slot_accuracy": ("a list of rates in 0..1", lambda value: are_rates(value, gaps=False)),
    "eval_slot_acceptance": ("a list of rates in 0..1 or null", lambda value: are_rates(value, gaps=True))}


def log_problem(records: list[tuple[str, object]]) -> str | None:
    """What makes a training log unreadable here, or None: a line that is not a JSON object, a figure breaking its
    rule in LOG_FIELD_RULES, a last line with slot accuracy but no step."""
    for where, record in records:
        line = where.rpartition(":")[2]
        if not isinstance(record, dict):
            return f"line {line} is not a JSON object"
        for name, (rule, ok) in LOG_FIELD_RULES.items():
            if record.get(name) is not None and not ok(record[name]):
                return f"line {line}: {name} must be {rule}, got {json.dumps(record[name])[:60]}"
    last = records[-1][1] if records else {}
    if last.get("slot_accuracy") is not None and last.get("step") is None:
        return f"line {records[-1][0].rpartition(':')[2]}: slot_accuracy without a step"
    return None


def is_between(value, low: float, high: float) -> bool:
    """A JSON number (not true/false) from low to high; NaN and the infinities are in no range."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def are_rates(values, gaps: bool) -> bool:
    """A non-empty list of rates in 0..1; with `gaps`, null where no draft reached a position."""
    return isinstance(values, list) and bool(values) and all(
        (gaps and value is None) or is_between(value, 0, 1) for value in values)


@dataclass
class Report:
    """Everything the check found; `fits` names the convention the drafter fits, `verdict` says what that means."""

    served_tau: float
    served_acceptance_per_slot: list[float | None]
    claimed: dict | None
    scores: dict[str, Score]
    fits: str
    verdict: str
    engine_fields: list[str] | None = None  # config.json fields vLLM or SGLang would misread
    engine: EngineComparison | None = None  # with --engine-acceptance


def which_convention_fits(conventions: Sequence[Convention], scores: dict[str, Score]) -> Convention:
    """The best-scoring convention, if it beats the configured one clearly; else the configured one."""
    configured, best = conventions[0], max(conventions, key=lambda c: scores[c.name].tau)
    return best if scores[best.name].tau > CLEARLY_BETTER * scores[configured.name].tau else configured


def check_drafter(target: Qwen3, drafter: Drafter, prompts: Sequence[tuple[list[int], list[int] | None]],
                  max_new_tokens: int, stop_ids: Sequence[int], mask_tokens: Sequence[int],
                  claimed: dict | None = None) -> Report:
    """Serve the prompts (greedy), then score every convention on the target's answers."""
    generations = [generate_dflash(target, drafter, ids, max_new_tokens, stop_ids=stop_ids,
                                   first_token_choices=choices) for ids, choices in prompts]
    lengths = [length for generation in generations for length in generation.acceptance_lengths]
    conventions = conventions_to_try(drafter, target.config.num_hidden_layers, mask_tokens)
    sequences = [(ids + generation.new_ids, len(ids)) for (ids, _), generation in zip(prompts, generations)]
    scores = teacher_forced(target, drafter, sequences, conventions)
    fits, tau = which_convention_fits(conventions, scores), sum(lengths) / max(len(lengths), 1)
    return Report(tau, per_position_acceptance(lengths, drafter.config.block_size), claimed, scores, fits.name,
                  fits.diagnosis + domain_gap(tau, claimed, fits is conventions[0]))


def domain_gap(served_tau: float, claimed: dict | None, fits_its_config: bool) -> str:
    """When the conventions are right, the other reason for a low tau: prompts unlike the drafter's training data."""
    claimed_tau = (claimed or {}).get("eval_tau")
    if not fits_its_config or claimed_tau is None or served_tau >= 0.8 * claimed_tau:
        return ""
    return (f"; but it accepts {served_tau:.2f} here against {claimed_tau:.2f} on its training run's held-out "
            f"prompts: these prompts are unlike its training data (another mode or domain); fine-tune it on the "
            f"target's answers to prompts like these (docs/training.md)")


# ------------------------------------------------------------------ a serving engine's numbers

# What --engine-acceptance takes. Engines count, per position k = 1, 2, ... (vLLM's index k-1), the
# drafts whose first k tokens were all accepted: a cumulative figure.
ENGINE_SHAPES = (
    "a list of per-position acceptance rates, as vLLM logs them (\"Per-position acceptance rate: "
    "0.91, 0.80, ...\": the share of drafts whose first k tokens were all kept); vLLM's counters "
    "as {\"num_drafts\": N, \"num_accepted_tokens_per_pos\": [...]} "
    "(vllm:spec_decode_num_drafts, vllm:spec_decode_num_accepted_tokens_per_pos by position); "
    "or SGLang's {\"spec_accept_histogram\": [...]} (verify steps that kept exactly 0, 1, 2... "
    "drafts), alone or in a whole response's meta_info")

# The engine parts from the log at the first position whose acceptance once reached is this far
# below the log's figure for that slot. A choice: wide enough to pass the noise of a few hundred
# drafts (about two points), narrow enough to catch a position served clearly worse.
CLEARLY_BELOW = 0.10
# A position fewer drafts reached than this is too noisy to name (known only from counts).
FEWEST_REACHED = 30

# The log's per-slot figures, best first: served acceptance once reached on held-out prompts (the
# engine's kind of figure), then each slot's accuracy alone, teacher-forced (an approximation).
LOG_FIGURES = ("eval_slot_acceptance", "heldout_slot_accuracy", "slot_accuracy")


@dataclass
class EngineAcceptance:
    """What an engine reported: per position k = 1..K, the share of drafts whose first k tokens
    were all accepted, and over how many drafts when the shape says."""

    cumulative: list[float]
    drafts: int | None
    shape: str


def read_engine_acceptance(path: Path) -> EngineAcceptance:
    """The engine's numbers in one of ENGINE_SHAPES, checked before any model loads."""
    where = f"--engine-acceptance {path}"
    data = parse_json(read_text(path, UsageError, "engine acceptance file"), where, UsageError)
    if isinstance(data, dict) and isinstance(data.get("meta_info"), dict):
        data = data["meta_info"]  # a whole SGLang response
    if isinstance(data, list):
        return EngineAcceptance(checked_rates(data, where), None, "per-position rates")
    if isinstance(data, dict) and "num_accepted_tokens_per_pos" in data:
        return from_vllm_counts(data, where)
    if isinstance(data, dict) and "spec_accept_histogram" in data:
        return from_sglang_histogram(data["spec_accept_histogram"], where)
    raise UsageError(f"{where}: expected {ENGINE_SHAPES}; got {json.dumps(data)[:80]}")


def checked_rates(rates, where: str) -> list[float]:
    """A cumulative series: numbers in 0..1 that never rise from one position to the next."""
    numbers = isinstance(rates, list) and all(is_between(r, -math.inf, math.inf) for r in rates)
    if not numbers or not rates:
        raise UsageError(f"{where}: expected a non-empty list of numbers, got "
                         f"{json.dumps(rates)[:80]}")
    for position, (before, rate) in enumerate(zip([1.0, *rates], rates), start=1):
        if not 0 <= rate <= 1:
            raise UsageError(f"{where}: position {position}'s rate {rate} is outside 0..1")
        if rate > before + 1e-9:
            raise UsageError(f"{where}: the rate rises at position {position} ({before} -> "
                             f"{rate}); engines report the share of drafts kept up to each "
                             f"position, which never rises")
    return [float(rate) for rate in rates]


def from_vllm_counts(data: dict, where: str) -> EngineAcceptance:
    """vLLM's counters: how many drafts in all, and per position how many kept it."""
    drafts, counts = data.get("num_drafts"), data["num_accepted_tokens_per_pos"]
    if not is_integer(drafts) or drafts <= 0:
        raise UsageError(f"{where}: num_drafts must be a positive integer, got "
                         f"{json.dumps(drafts)[:80]}")
    if not isinstance(counts, list) or not all(is_integer(c) and c >= 0 for c in counts):
        raise UsageError(f"{where}: num_accepted_tokens_per_pos must be a list of counts, got "
                         f"{json.dumps(counts)[:80]}")
    for position, count in enumerate(counts, start=1):  # compared before dividing: no overflow
        if count > drafts:
            raise UsageError(f"{where}: position {position}'s rate {count}/{drafts} is outside "
                             f"0..1 (more drafts kept than made)")
    return EngineAcceptance(checked_rates([c / drafts for c in counts], where), drafts,
                            f"vLLM counts over {drafts} drafts")


def from_sglang_histogram(histogram, where: str) -> EngineAcceptance:
    """SGLang's histogram h[n], steps that kept exactly n drafts: position k was kept by the
    steps that kept k or more, sum(h[k:]) of sum(h)."""
    if (not isinstance(histogram, list) or len(histogram) < 2
            or not all(is_integer(h) and h >= 0 for h in histogram) or not sum(histogram)):
        raise UsageError(f"{where}: spec_accept_histogram must be a list of at least two counts, "
                         f"not all 0, got {json.dumps(histogram)[:80]}")
    steps = sum(histogram)
    return EngineAcceptance([sum(histogram[k:]) / steps for k in range(1, len(histogram))], steps,
                            f"SGLang histogram over {steps} steps")


def once_reached(cumulative: Sequence[float]) -> list[float | None]:
    """Per position k, acceptance among the drafts that reached it: the share kept up to k over
    the share kept up to k-1 (None where none reached it): what eval_slot_acceptance logs."""
    before = [1.0, *cumulative[:-1]]
    return [kept / reached if reached > 0 else None for kept, reached in zip(cumulative, before)]


def running_product(rates: Sequence[float | None]) -> list[float]:
    """Per position k, the product of the rates up to k. From acceptance once reached it is the
    engine's cumulative figure exactly; from slot accuracy (each slot scored alone) it is
    tau_estimate's approximation of it, the slots' hits taken as independent."""
    products, product = [], 1.0
    for rate in rates:
        product *= rate or 0.0
        products.append(product)
    return products


@dataclass
class EngineComparison:
    """The engine's per-position figures beside the log's and the ones served here, as acceptance
    once reached and as cumulative; `parts_at`: the first position where the engine falls clearly
    below the reference (the log, or what is served here when there is no log), None: nowhere."""

    shape: str
    reference: str
    engine_once_reached: list[float | None]
    log_per_slot: list[float | None]
    here_once_reached: list[float | None]
    engine_cumulative: list[float]
    log_cumulative: list[float]
    here_cumulative: list[float]
    parts_at: int | None
    verdict: str


def first_gap(engine: EngineAcceptance, reference: Sequence[float | None]) -> int | None:
    """The first position whose acceptance once reached is CLEARLY_BELOW the reference's, among
    the positions enough drafts reached to tell."""
    rates = once_reached(engine.cumulative)
    reached = [1.0, *engine.cumulative[:-1]]
    for position, (rate, wanted) in enumerate(zip(rates, reference), start=1):
        if engine.drafts is not None and engine.drafts * reached[position - 1] < FEWEST_REACHED:
            return None  # later positions are reached by fewer still
        if rate is not None and wanted is not None and rate < wanted - CLEARLY_BELOW:
            return position
    return None


def compare_with_engine(engine: EngineAcceptance, claimed: dict | None,
                        here: Sequence[float | None]) -> EngineComparison:
    """Set the engine's figures beside the log's best per-slot figure (else beside what is
    served here) and say where the engine parts from it."""
    figure = next((name for name in LOG_FIGURES if (claimed or {}).get(name)), None)
    log = list(claimed[figure]) if figure else []
    reference = f"the training log's {figure}" if figure else "the drafter served here"
    parts_at = first_gap(engine, log if figure else here)
    comparison = EngineComparison(
        engine.shape, reference, once_reached(engine.cumulative), log, list(here),
        engine.cumulative, running_product(log), running_product(here), parts_at, "")
    comparison.verdict = engine_verdict(comparison, bool(figure))
    return comparison


def engine_verdict(comparison: EngineComparison, has_log: bool) -> str:
    """No gap; or where the engine parts from the reference, and whether the drafter does better
    served here (then the engine serves it otherwise than it was trained) or not (the drafter)."""
    k = comparison.parts_at
    if k is None:
        return (f"no gap: at every position the engine keeps as many of the drafts that reach it "
                f"as {comparison.reference} (within {CLEARLY_BELOW:.2f})")
    served_here = comparison.here_once_reached
    here = served_here[k - 1] if k <= len(served_here) else None
    wanted = comparison.log_per_slot[k - 1] if has_log else here
    verdict = (f"the engine parts from {comparison.reference} at position {k} (vLLM's index "
               f"{k - 1}): it keeps {comparison.engine_once_reached[k - 1]:.2f} of the drafts "
               f"that reach it, against {wanted:.2f}")
    if here is None:
        return verdict
    if here >= wanted - CLEARLY_BELOW:
        return verdict + (f"; served here the drafter keeps {here:.2f} there, so the engine "
                          f"serves it otherwise than it was trained: check the config fields it "
                          f"reads (listed above when wrong), its number of speculative tokens, "
                          f"its target and its prompts")
    return verdict + (f"; served here it keeps only {here:.2f} there too: the drafter, not the "
                      f"engine (see the verdict above)")


def print_engine_comparison(comparison: EngineComparison) -> None:
    """Per position: acceptance once reached and cumulative, engine, log and here side by side."""
    def cell(value) -> str:
        return "   -" if value is None else f"{value:.2f}"

    print(f"engine ({comparison.shape}) beside {comparison.reference} and the drafter served here:")
    print("  engines count, per position k, the drafts whose first k tokens were all kept "
          "(cumulative);")
    print("  over the count at k-1, that is acceptance once reached (eval_slot_acceptance's "
          "figure);")
    print("  slot_accuracy scores each slot alone: its running product approximates the "
          "cumulative figure")
    print("  position | once reached: engine   log  here | cumulative: engine   log  here")
    columns = (comparison.engine_once_reached, comparison.log_per_slot,
               comparison.here_once_reached, comparison.engine_cumulative,
               comparison.log_cumulative, comparison.here_cumulative)
    for k in range(1, len(comparison.engine_cumulative) + 1):
        once, log, here, cumulative, log_cumulative, here_cumulative = (
            column[k - 1] if k <= len(column) else None for column in columns)
        print(f"  {k:8d} | {cell(once):>20} {cell(log):>5} {cell(here):>5} | "
              f"{cell(cumulative):>18} {cell(log_cumulative):>5} {cell(here_cumulative):>5}")
    print(f"verdict (engine): {comparison.verdict}")


def print_report(report: Report) -> None:
    """The claim beside the measurement, every convention's score, and the verdict."""
    def row(values) -> str:
        return " ".join("   -" if value is None else f"{value:.2f}" for value in values)

    claimed = report.claimed
    if claimed:
        print(f"training log, step {claimed['step']} (its training data):")
        print(f"  slot accuracy {row(claimed['slot_accuracy'])}")
        estimate, held_out = claimed["tau_estimate"], claimed["eval_tau"]
        print("  tau estimate " + ("-" if estimate is None else f"{estimate:.2f}")
              + ("" if held_out is None else f", held-out tau {held_out:.2f}"))
    else:
        print("training log: none beside the drafter")
    configured = report.scores["as configured"]
    print("here, teacher-forced on the target's answers (as the log counts):")
    print(f"  slot accuracy {row(configured.slot_accuracy)}")
    print(f"  tau estimate {configured.tau_estimate:.2f}")
    print(f"here, served (greedy): tau {report.served_tau:.2f}, acceptance per slot once reached:")
    print(f"  {row(report.served_acceptance_per_slot)}")
    print("conventions (teacher-forced tau: 1 + mean run of right drafts from every answer position):")
    for name, score in report.scores.items():
        print(f"  {name:<24} {score.tau:6.2f}{'   <- fits' if name == report.fits else ''}")
    if report.engine_fields is not None:
        print("serving config (benchmarks/engine_fields.py): " + (
            "every field vLLM and SGLang read is as they expect" if not report.engine_fields
            else f"{len(report.engine_fields)} field(s) vLLM or SGLang would read otherwise:"))
        for problem in report.engine_fields:
            print(f"  {problem}")
    print(f"verdict: {report.verdict}")
    if report.engine is not None:
        print_engine_comparison(report.engine)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description="Say why a drafter accepts less than it should (see the module docstring).",
                           epilog=f"--prompts: {PROMPT_FORMAT}", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the target's checkpoint folder")
    parser.add_argument("--draft", required=True, help="the drafter's checkpoint folder")
    parser.add_argument("--prompts", required=True, help="prompts like the traffic the drafter serves (a few dozen)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens answered per prompt")
    parser.add_argument("--mask-token-ids", type=int_list, default=[],
                        help="more mask tokens to try, e.g. 151669 (always tried: the tokenizer's <|mask|>, the "
                             "first id past the tokenizer, the last embedding row, <|endoftext|>)")
    parser.add_argument("--engine-acceptance", metavar="FILE",
                        help="a serving engine's per-position acceptance, pasted as JSON: "
                             + ENGINE_SHAPES)
    parser.add_argument("--json", help="also write the report to this file")
    add_prompt_options(parser)
    add_device_options(parser)
    return parser


def run(args) -> int:
    inputs = {"--model": args.model, "--draft": args.draft, "--prompts": args.prompts,
              "--engine-acceptance": args.engine_acceptance}
    check_report_output(args.json, "--json", inputs)  # not only after the whole check has run
    check_prompt_options(args)
    engine = None  # read before any model loads: a bad file costs nothing
    if args.engine_acceptance:
        engine = read_engine_acceptance(Path(args.engine_acceptance))
    device = pick_device(args.device)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=pick_dtype(args.dtype, device))
    check_token_ids(args.mask_token_ids, target.config.vocab_size, "--mask-token-ids")
    drafter = Drafter.from_pretrained(args.draft, target, device=device, dtype=target.embed_tokens.weight.dtype)
    drafted = drafter.config.block_size - 1
    if engine and len(engine.cumulative) > drafted:
        raise UsageError(f"--engine-acceptance {args.engine_acceptance}: {len(engine.cumulative)} "
                         f"positions, but this drafter drafts {drafted} tokens a step: is it this "
                         f"drafter's figure?")
    tokenizer = find_tokenizer(Path(args.model))
    prompts = [encode_for_generation(prompt, tokenizer, args.chat, args.thinking, args.token_healing)
               for prompt in read_prompts(Path(args.prompts))]
    report = check_drafter(target, drafter, prompts, args.max_new_tokens, stop_token_ids(args.model, tokenizer),
                           candidate_mask_tokens(target, tokenizer, args.mask_token_ids),
                           training_log_claim(Path(args.draft)))
    report.engine_fields = engine_field_problems(read_json(Path(args.draft) / "config.json"),
                                                 read_json(Path(args.model) / "config.json"))
    if engine:
        report.engine = compare_with_engine(engine, report.claimed,
                                            report.served_acceptance_per_slot)
    print_report(report)
    if args.json:
        write_report(Path(args.json), asdict(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
