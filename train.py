"""Train a DFlash drafter for a frozen Qwen3 target: the recipe, then the loop (docs/training.md).

The data is the target's own answers (`make_data.py`); the frozen target reads each once, and its
hidden states after `target_layer_ids` are the drafter's context. Each step draws anchors a in the
answers (`dflash.training.micro_batches` draws a step's sequences, shares them out over processes
and micro-batches, and anchors them): the block [x_a, MASK, ..., MASK] at a..a+B-1 is what the
drafter sees once x_a is verified; all blocks run in one forward, each seeing the context before
its anchor and itself (`AnchoredBlocks`). Slot k predicts x_{a+k} through the target's LM head,
weighted exp(-(k-1)/gamma) as a draft counts up to its first miss. A step's loss is the mean over
its global batch (processes x micro-batches x sequences): torchrun and --grad-accum train the
drafter one process trains."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from dflash.cli import UsageError, refuse_overlap, run_cli
from dflash.dflash2 import DFlash2Config, DFlash2Drafter, selector_loss
from dflash.drafter import DrafterConfig
from dflash.evaluation import evaluate
from dflash.qwen3 import Qwen3, masked
from dflash.train_config import (  # noqa: F401 (DEFAULT_*, build_drafter_config: notebook 4's)
    DEFAULT_BLOCK_SIZE, DEFAULT_DRAFTER_LAYERS, MAY_CHANGE_ON_RESUME, TrainConfig, build_parser,
    build_drafter_config, starting_or_resuming)
from dflash.train_kernels import AnchoredBlocks, chunked_lm_head_loss
from dflash.train_run import Inputs, TrainingRun, build_run, load_inputs
from dflash.training import (  # noqa: F401 (batch_anchors, collate...: notebook 4's, the labs')
    LOG_FILE, RUN_OUTPUTS, Distributed, LogTally, MicroBatch, Signals, apply_gradients,
    batch_anchors, collate, distributed_run, freeze, full_state_dict, gradient_sync,
    heldout_batches, init_weights as init_drafter, keep_if_best, micro_batch, micro_batches,
    owned_run_folder, sample_anchors, save_checkpoint, unwrap, valid_anchor_positions,
    what_is_due, write_log)

IGNORE = -100  # cross_entropy's ignore_index: this slot has no label


# ------------------------------------------------------------------ the recipe: blocks and labels


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block j occupies positions a_j .. a_j+B-1: (batch, K*B)."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)  # (batch, K, B) -> (batch, K*B)


def block_input_ids(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                    mask_token_id: int) -> torch.Tensor:
    """[x_a, MASK, ..., MASK] for every anchor: (batch, K*B)."""
    batch, count = anchors.shape
    blocks = torch.full((batch, count, block_size), mask_token_id, dtype=torch.long,
                        device=anchors.device)
    blocks[:, :, 0] = input_ids.gather(1, anchors)  # (batch, K): the known token
    return blocks.flatten(1)  # (batch, K, B) -> (batch, K*B)


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                 real: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slot k of the block at a is labelled x_{a+k} (no shift), or IGNORE: (batch, K*B)."""
    length = input_ids.shape[1]
    positions = block_positions(anchors, block_size)  # (batch, K*B)
    clamped = positions.clamp(max=length - 1)
    keep = (positions < length) & (loss_mask.gather(1, clamped) == 1)  # in the answer
    slot = torch.arange(positions.shape[1], device=anchors.device) % block_size  # (K*B,)
    keep &= (slot != 0)[None]  # not the known token
    keep &= real.repeat_interleave(block_size, dim=1)  # not padding: (batch, K) -> (batch, K*B)
    return torch.where(keep, input_ids.gather(1, clamped), IGNORE)


def gamma_for_block_size(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8; linear between, else proportional."""
    if 8 <= block_size <= 16:
        return float(np.interp(block_size, [8, 10, 16], [4.0, 5.0, 7.0]))
    return block_size / 2 if block_size < 8 else 7.0 * block_size / 16


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1, and 0 for slot 0: (B,)."""
    weights = torch.exp(-(torch.arange(block_size, dtype=torch.float32) - 1) / gamma)
    weights[0] = 0.0
    return weights


def label_weights(labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each block slot's weight in the loss: w_k where slot k has a label, else 0: (batch, K*B)."""
    slots = torch.arange(labels.shape[1], device=labels.device) % len(weights)  # (K*B,)
    return torch.where(labels != IGNORE, weights.to(labels.device)[slots], 0.0)


# ------------------------------------------------------------------ a micro-batch's loss


def step_weight(batches: list[MicroBatch], weights: torch.Tensor) -> torch.Tensor:
    """The weight of every labelled slot of this process's micro-batches, known before any forward:
    summed over the processes, dividing by it makes each micro-batch's loss its share of the
    step's."""
    return sum(label_weights(block_labels(*batch, len(weights)), weights).sum()
               for batch in batches)


@torch.no_grad()  # the frozen target: its features are an input, not part of the graph
def target_features(target: Qwen3, input_ids: torch.Tensor, config: DrafterConfig,
                    last_hidden: bool = False):
    """The target's outputs after `config.target_layer_ids`, side by side: (batch, S, layers *
    hidden), float32 off CUDA (the drafter's dtype: no autocast). No later layer runs, but with
    `last_hidden`: (features, last hidden state (batch, S, hidden), distillation's teacher)."""
    hidden, features = target(input_ids, capture_layers=config.target_layer_ids,
                              last_layer=None if last_hidden else max(config.target_layer_ids))
    features = features if input_ids.device.type == "cuda" else features.float()
    return (features, hidden) if last_hidden else features


def drafter_loss(target: Qwen3, drafter: nn.Module, features: torch.Tensor, batch: MicroBatch, *,
                 config: DrafterConfig, weights: torch.Tensor,
                 weight_total: torch.Tensor | None = None, loss_chunk_size: int = 512,
                 dense_attention: bool = False, target_hidden=None, distill_weight: float = 1.0,
                 selector_weight: float = 1.0):
    """Weighted cross-entropy of every block slot (mixed, given `target_hidden`, with KL(target ||
    drafter) by `distill_weight`) over `weight_total` (default: their weight, a mean); (correct,
    counted) per slot (B,) for the logs. `dense_attention`, `loss_chunk_size` 0: the dense ways.
    A DFlash2 drafter adds its selector's loss by `selector_weight` (`dflash2_loss`)."""
    input_ids, loss_mask, anchors, real = batch
    block_size = config.block_size
    with torch.no_grad():
        block_ids = block_input_ids(input_ids, anchors, block_size, config.mask_token_id)
        block_embeddings = target.embed_tokens(block_ids).to(features.dtype)  # (batch, K*B, h)
    pattern = AnchoredBlocks(anchors, input_ids.shape[1], block_size)
    attend = masked(pattern.dense_mask()) if dense_attention else pattern.attend  # the same, twice
    context_positions = torch.arange(input_ids.shape[1], device=anchors.device)  # (S,)
    dflash2 = isinstance(config, DFlash2Config)  # its blocks lie side by side: say how long
    blocks = {"block_size": block_size} if dflash2 else {}
    hidden = drafter(features, block_embeddings, context_positions,
                     block_positions(anchors, block_size), attend=attend,
                     **blocks)  # (batch, K*B, hidden)
    labels = block_labels(input_ids, loss_mask, anchors, real, block_size)  # (batch, K*B)
    scored = labels != IGNORE
    slot_weight = label_weights(labels, weights)[scored]  # (N,)
    total = slot_weight.sum() if weight_total is None else weight_total
    before = scored.nonzero()[:, 0], block_positions(anchors, block_size)[scored] - 1  # (N,) each
    teacher = None if target_hidden is None else target_hidden[before]  # x_p's: at p - 1, (N, h)
    if dflash2:  # the token before each labelled slot: the selector's teacher-forced predecessor
        loss, hits = dflash2_loss(target, unwrap(drafter), hidden[scored], labels[scored],
                                  input_ids[before], slot_weight / total,
                                  chunk_size=loss_chunk_size, selector_weight=selector_weight)
    else:
        loss, hits = chunked_lm_head_loss(hidden[scored], target.head_weight, labels[scored],
                                          slot_weight / total, loss_chunk_size,  # labelled only
                                          teacher=teacher, distill_weight=distill_weight)
    slots = torch.arange(labels.shape[1], device=labels.device) % block_size  # (K*B,)
    slots = slots.expand_as(labels)[scored]  # (N,)
    correct = torch.bincount(slots, weights=hits.float(), minlength=block_size)  # (B,)
    return loss, correct, torch.bincount(slots, minlength=block_size).float()


def dflash2_loss(target: Qwen3, drafter: DFlash2Drafter, hidden: torch.Tensor, labels: torch.Tensor,
                 predecessors: torch.Tensor, weights: torch.Tensor, *, chunk_size: int,
                 selector_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A DFlash2 drafter's loss at N labelled slots, sum_i w_i * (CE of its head (scaled, capped)
    with label_i + selector_weight * the selector's CE over its candidates (`selector_loss`), which
    trains the selector's own weights only),
    and the selector's teacher-forced hits (N,): what its walk drafts right, given the drafts
    before were right. hidden (N, hidden); labels, predecessors, weights (N,). `chunk_size` slots
    at a time, each chunk's (n, vocab) logits recomputed in the backward, not kept; 0: at once."""
    def chunk(hidden, labels, predecessors, weights):
        logits = drafter.logits(hidden, target).float()  # (n, vocab)
        head = F.cross_entropy(logits, labels, reduction="none")  # (n,)
        # The selector learns on top of the head, not through it: with a true token outside
        # the top-k, its loss would repeat the head's, doubling that gradient (SpecForge PR
        # #793's stop-gradient).
        selector, hits = selector_loss(drafter.candidate_selector, hidden.detach(),
                                       logits.detach(), predecessors, labels)
        return (weights * (head + selector_weight * selector)).sum(), hits

    if chunk_size <= 0:
        return chunk(hidden, labels, predecessors, weights)
    total, hits = torch.zeros((), device=hidden.device), []
    for start in range(0, len(labels), chunk_size):
        rows = slice(start, start + chunk_size)
        loss, chunk_hits = torch.utils.checkpoint.checkpoint(
            chunk, hidden[rows], labels[rows], predecessors[rows], weights[rows],
            use_reentrant=False)
        total, hits = total + loss, hits + [chunk_hits]
    return total, torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


# ------------------------------------------------------------------ the run


def start_run(cfg: TrainConfig, place: Distributed, inputs: Inputs | None = None) -> TrainingRun:
    """The run (`dflash.train_run`), its loss weighting the slots as this recipe does."""
    gamma = lambda block: cfg.gamma or gamma_for_block_size(block)  # noqa: E731
    return build_run(cfg, place, lambda block: slot_weights(block, gamma(block)), inputs)


def batch_loss(run: TrainingRun, batch: MicroBatch, weight_total: torch.Tensor):
    """The target's features, then `drafter_loss`: what a step, and the held-out split, compute."""
    cfg = run.cfg
    distilling = cfg.distill_weight > 0  # then the whole target runs: its last hidden state too
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=run.place.device.type == "cuda"):
        outputs = target_features(run.target, batch.input_ids, run.drafter_config, distilling)
        features, last_hidden = outputs if distilling else (outputs, None)  # (batch, S, F)
        return drafter_loss(run.target, run.model, features, batch, config=run.drafter_config,
                            weights=run.slot_weights, weight_total=weight_total,
                            loss_chunk_size=cfg.loss_chunk_size,
                            dense_attention=cfg.dense_attention, target_hidden=last_hidden,
                            distill_weight=cfg.distill_weight,
                            selector_weight=cfg.selector_weight)


@torch.no_grad()
def heldout_figures(run: TrainingRun) -> dict:
    """The training loss and per-slot accuracy on --heldout's sequences, anchored alike at every
    evaluation. A collective call: each process runs as many forwards (`heldout_batches`)."""
    batches = heldout_batches(run.heldout, run.cfg, run.place)
    tally = LogTally.zeros(run.drafter_config.block_size, run.place.device)
    weight_total = run.place.sum(step_weight(batches, run.slot_weights))  # every process's
    for batch in batches:
        tally.add(*batch_loss(run, batch, weight_total))
    tally.end_step(torch.zeros((), device=run.place.device))
    figures = tally.pooled(run.place)
    return {"heldout_loss": figures["loss"], "heldout_slot_accuracy": figures["slot_accuracy"]}


def train_step(run: TrainingRun) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on the global batch: batch (with its anchors) -> target features ->
    loss -> step. The anchors come with the batch: the step's loss is a mean over the labelled
    slots of every micro-batch, known before the first forward. Returns (loss, gradient norm)."""
    cfg, place = run.cfg, run.place
    batches = micro_batches(run.sequences, run.step, run.global_batch, cfg, place)  # anchored
    weight_total = place.sum(step_weight(batches, run.slot_weights))  # every process's
    step_loss = torch.zeros((), device=place.device)
    for number, batch in enumerate(batches, start=1):
        with gradient_sync(run.model, enabled=number == len(batches)):  # reduce once, the sum
            loss, correct, counted = batch_loss(run, batch, weight_total)  # features, then loss
            (loss * place.world).backward()  # DDP and FSDP average over processes: we want the sum
        run.tally.add(loss, correct, counted)
        run.tokens_seen += batch.input_ids.numel()
        step_loss += loss.detach()
    gradient_norm = apply_gradients(run.model, run.optimizer, cfg.grad_clip)
    run.tally.end_step(gradient_norm)
    run.scheduler.step()
    run.step += 1
    return step_loss, gradient_norm


def checkpoint(run: TrainingRun) -> None:
    """Save the run as it stands at this step, unless saved already (a collective call)."""
    if run.saved_step == run.step:
        return
    state = {**run.saved, "step": run.step, "elapsed": run.elapsed()}
    save_checkpoint(Path(run.cfg.out), run.model, run.optimizer, run.scheduler, run.place, state,
                    previous=run.saved_step)
    run.saved_step, run.last_save = run.step, time.perf_counter()


def log_line(run: TrainingRun, bar, evaluating: bool) -> dict:
    """The log's record of the steps since the last one, with an evaluation when due (a collective
    call); the main process appends it to the log."""
    record = {"step": run.step, "sequences": run.step * run.global_batch,
              **run.tally.pooled(run.place), "lr": run.scheduler.get_last_lr()[0],
              "elapsed": round(run.elapsed(), 2)}
    if evaluating and run.cfg.eval_prompts:
        state_dict = full_state_dict(run.model, run.cfg.fsdp)  # gathered from FSDP2's shards
        record.update(evaluate(run.target, run.drafter_config, state_dict, run.continuations,
                               run.place))
    if evaluating and run.heldout is not None:
        record.update(heldout_figures(run))
    if run.place.main:
        seconds = max(run.elapsed() - run.elapsed_before, 1e-9)
        write_log(Path(run.cfg.out) / LOG_FILE, record, bar,
                  run.place.world * run.tokens_seen / seconds)
    return record


def train(cfg: TrainConfig, place: Distributed) -> dict:
    """Train (or resume) this process's share; return the last log record. When due: checkpoint,
    then log (with an evaluation: a failing one never loses the run), then keep the step in best/
    if its held-out loss is the lowest yet. Ctrl-C or SIGTERM ends the step, saves, and sets
    `stopped_by`; a second one during the save waits for its end. Check, then touch: every input
    is loaded and checked before the run folder is judged, locked or emptied (--force)."""
    refuse_overlap({"--out": cfg.out}, {"--target": cfg.target, "--data": cfg.data,
                                        "--init-from": cfg.init_from, "--tokenizer": cfg.tokenizer,
                                        "--eval-prompts": cfg.eval_prompts})
    inputs = load_inputs(cfg, place)
    with owned_run_folder(Path(cfg.out), cfg.resume, cfg.force, RUN_OUTPUTS, place.main):
        run = start_run(cfg, place, inputs)
        record, due = {}, None
        with Signals() as signals, tqdm(total=run.total_steps, initial=run.step, unit="step",
                                        disable=not place.main) as bar:
            while run.step < run.last_step:
                loss, gradient_norm = train_step(run)
                bar.update(1)
                due = what_is_due(run, signals, loss, gradient_norm)
                if due.save:
                    with signals.deferred():  # a second Ctrl-C cannot cut a checkpoint in half
                        checkpoint(run)
                if due.log:
                    record = log_line(run, bar, evaluating=due.evaluate)
                if "heldout_loss" in record and due.evaluate:  # the lowest yet: kept in best/
                    with signals.deferred():
                        keep_if_best(Path(cfg.out), record["heldout_loss"], run.step, place,
                                     save=lambda: checkpoint(run))
                if due.stop:
                    break
    if due is not None and due.signaled:
        record["stopped_by"] = signals.name or "SIGTERM"  # another process's: a scheduler's
    return record


def train_from_args(args: argparse.Namespace) -> int:
    """Train as the command line says; a run stopped by a signal exits as the shell expects (130
    for Ctrl-C)."""
    if args.fsdp and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        raise UsageError("--fsdp shards the drafter over torchrun's processes: run under torchrun")
    try:
        with distributed_run(args.device) as place:
            record = train(starting_or_resuming(TrainConfig(**vars(args))), place)
    except KeyboardInterrupt:  # a second Ctrl-C (or one before training): at once, never mid-save
        print(f"stopped at once by SIGINT: {args.out} keeps its last complete checkpoint, if one "
              f"was saved (to continue, run the same command with --resume)", file=sys.stderr)
        return 128 + signal.SIGINT
    if "stopped_by" not in record:
        return 0
    if place.main:  # one line, however many processes
        print(f"stopped by {record['stopped_by']} at step {record['step']}: checkpoint saved in "
              f"{args.out}; to continue, run the same command with --resume", file=sys.stderr)
    return 128 + signal.Signals[record["stopped_by"]].value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when trained, 2 (and one `error:` line) on bad input."""
    return run_cli(build_parser(), train_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
