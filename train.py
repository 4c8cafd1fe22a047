"""Train a DFlash drafter for a frozen Qwen3 target, from scratch: the recipe, then the loop (docs/training.md).

The data is the target's own answers (`make_data.py`); the frozen target reads each once, and its hidden states
after `target_layer_ids` are the drafter's context. Each step draws anchors a in the answers: the block [x_a, MASK,
..., MASK] at a..a+B-1 is what the drafter sees once x_a is verified; all blocks run in one forward, each seeing the
context before its anchor and itself (`AnchoredBlocks`). Slot k predicts x_{a+k} through the target's LM head,
weighted exp(-(k-1)/gamma) as a draft counts up to its first miss. A step's loss is the mean over its global batch
(processes x micro-batches x sequences): torchrun and --grad-accum train the drafter one process trains."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from dflash.cli import (HelpWithDefaults, OneLineErrors, UsageError, add_device_options, checked, int_list, pick_dtype,
                        positive, positive_int, run_cli)
from dflash.drafter import Drafter, DrafterConfig, check_fits, default_target_layer_ids
from dflash.prompts import PROMPT_FORMAT, check_no_mask_token, check_request
from dflash.qwen3 import Qwen3, Qwen3Config, masked
from dflash.tokenizer import find_tokenizer, stop_token_ids
from dflash.train_kernels import AnchoredBlocks, chunked_lm_head_loss
from dflash.training import (LOG_FILE, STATE_FILE, Distributed, LogTally, anchor_generator, apply_gradients,
                             cosine_with_warmup, distributed_run, freeze, global_batch_items,
                             gradient_sync, init_weights as init_drafter, prepare_run_folder, resume,
                             save_checkpoint, share_of_batch, steps_per_epoch, stop_on_signals, unwrap,
                             wrap_for_training, write_log)
from generate import generate_dflash
from make_data import collate, encode_prompts, load_sequences

IGNORE = -100  # cross_entropy's ignore_index: this slot has no label
DEFAULT_DRAFTER_LAYERS, DEFAULT_BLOCK_SIZE = 5, 16  # a new drafter's; --init-from takes the drafter's own
# What --resume may change: when to stop, what to log and evaluate, where to run. The rest must be as saved.
MAY_CHANGE_ON_RESUME = ("resume", "force", "minutes", "stop_at", "eval_prompts", "eval_every",
                        "eval_max_new_tokens", "save_every", "save_every_minutes", "log_every", "device")


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Where inference drafts a block: x_a and x_{a+1} are answer tokens (the prefill yields the first answer token)."""
    answer = loss_mask == 1
    return (answer[:-1] & answer[1:]).nonzero()[:, 0]  # (n,): a such that a + 1 < S


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `num_anchors` distinct valid anchors, uniformly without replacement, sorted."""
    valid = valid_anchor_positions(loss_mask)
    picks = torch.randperm(len(valid), generator=generator)[:num_anchors]
    return valid[picks.to(valid.device)].sort().values


def batch_anchors(loss_mask: torch.Tensor, num_anchors: int, generators: Sequence[torch.Generator]):
    """Anchors for every row, row i's drawn by `generators[i]`, padded to the batch's largest count: (batch, K)
    positions and (batch, K) is-real."""
    per_row = [sample_anchors(row.cpu(), num_anchors, generator) for row, generator in zip(loss_mask, generators,
                                                                                            strict=True)]
    anchors = pad_sequence(per_row, batch_first=True)  # (batch, K); padding blocks sit at 0
    real = pad_sequence([torch.ones(len(a), dtype=torch.bool) for a in per_row], batch_first=True)  # (batch, K)
    return anchors.to(loss_mask.device), real.to(loss_mask.device)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block j occupies positions a_j .. a_j+B-1: (batch, K*B)."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)  # (batch, K, B) -> (batch, K*B)


def block_input_ids(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """[x_a, MASK, ..., MASK] for every anchor: (batch, K*B)."""
    batch, count = anchors.shape
    blocks = torch.full((batch, count, block_size), mask_token_id, dtype=torch.long, device=anchors.device)
    blocks[:, :, 0] = input_ids.gather(1, anchors)  # (batch, K): the known token
    return blocks.flatten(1)  # (batch, K, B) -> (batch, K*B)


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, real: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Slot k of the block at a is labelled x_{a+k}, at the same position (no shift), or IGNORE: (batch, K*B)."""
    length = input_ids.shape[1]
    positions = block_positions(anchors, block_size)  # (batch, K*B)
    clamped = positions.clamp(max=length - 1)
    keep = (positions < length) & (loss_mask.gather(1, clamped) == 1)  # not past the end, and in the answer
    keep &= (torch.arange(positions.shape[1], device=anchors.device) % block_size != 0)[None]  # not the known token
    keep &= real.repeat_interleave(block_size, dim=1)  # not a padding block: (batch, K) -> (batch, K*B)
    return torch.where(keep, input_ids.gather(1, clamped), IGNORE)


def gamma_for_block_size(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8; linear in between, proportional outside."""
    if 8 <= block_size <= 16:
        return float(np.interp(block_size, [8, 10, 16], [4.0, 5.0, 7.0]))
    return block_size / 2 if block_size < 8 else 7.0 * block_size / 16


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1, and 0 for slot 0: (B,)."""
    weights = torch.exp(-(torch.arange(block_size, dtype=torch.float32) - 1) / gamma)
    weights[0] = 0.0
    return weights


def label_weights(labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each block slot's weight in the loss: w_k where slot k has a label, 0 where not: (batch, K*B)."""
    slots = torch.arange(labels.shape[1], device=labels.device) % len(weights)  # (K*B,): k of every slot
    return torch.where(labels != IGNORE, weights.to(labels.device)[slots], 0.0)


class MicroBatch(NamedTuple):
    """Sequences and the blocks drawn in them: what one forward of the drafter trains on."""
    input_ids: torch.Tensor  # (batch, S)
    loss_mask: torch.Tensor  # (batch, S): 1 on the answer's tokens
    anchors: torch.Tensor  # (batch, K): where each block starts
    real: torch.Tensor  # (batch, K): False for the padding blocks of rows with fewer anchors


def micro_batches(sequences: list, step: int, global_batch: int, cfg: TrainConfig,
                  place: Distributed) -> list[MicroBatch]:
    """This process's micro-batches of `step`, anchored. Which sequences a step trains on, and where their blocks
    start, depend on the global batch (its size, the seed, the step), not on how the processes share it out."""
    epoch, items = global_batch_items(len(sequences), global_batch, step, cfg.seed)
    batches = []
    for indices in share_of_batch(items, place, cfg.grad_accum):
        input_ids, loss_mask = collate([sequences[i] for i in indices], place.device)  # (batch, S) each
        generators = [anchor_generator(cfg.seed, epoch, i) for i in indices]
        batches.append(MicroBatch(input_ids, loss_mask, *batch_anchors(loss_mask, cfg.num_anchors, generators)))
    return batches


def step_weight(batches: list[MicroBatch], weights: torch.Tensor, place: Distributed) -> torch.Tensor:
    """The weight of every labelled slot of a step, over its micro-batches and all processes: dividing by it makes
    each micro-batch's loss its share of the step's weighted mean. Known from the data before any forward pass."""
    return place.sum(sum(label_weights(block_labels(*batch, len(weights)), weights).sum() for batch in batches))


def drafter_loss(target: Qwen3, drafter: nn.Module, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                 anchors: torch.Tensor, real: torch.Tensor, *, config: DrafterConfig, weights: torch.Tensor,
                 weight_total: torch.Tensor | None = None, loss_chunk_size: int = 512, dense_attention: bool = False):
    """Weighted cross-entropy of every block slot over `weight_total` (default: these slots' weight, a mean), and
    (correct, counted) per slot (B,) for the logs. `dense_attention` and `loss_chunk_size` 0 take the dense ways,
    the references the fast ones are tested against."""
    block_size = config.block_size
    with torch.no_grad():  # the frozen target: its features are an input, not part of the graph
        _, features = target(input_ids, capture_layers=config.target_layer_ids,  # (batch, S, layers * hidden)
                             last_layer=max(config.target_layer_ids))  # no layer past the last one read
        block_ids = block_input_ids(input_ids, anchors, block_size, config.mask_token_id)  # (batch, K*B)
        block_embeddings = target.embed_tokens(block_ids)  # (batch, K*B, hidden)
    pattern = AnchoredBlocks(anchors, input_ids.shape[1], block_size)
    attend = masked(pattern.dense_mask()) if dense_attention else pattern.attend  # the same pattern, two ways
    hidden = drafter(features, block_embeddings, torch.arange(input_ids.shape[1], device=input_ids.device),
                     block_positions(anchors, block_size), attend=attend)  # (batch, K*B, hidden)
    labels = block_labels(input_ids, loss_mask, anchors, real, block_size)  # (batch, K*B)
    scored = labels != IGNORE
    slot_weight = label_weights(labels, weights)[scored]  # (N,)
    total = slot_weight.sum() if weight_total is None else weight_total
    loss, hits = chunked_lm_head_loss(hidden[scored], target.head_weight, labels[scored], slot_weight / total,
                                      loss_chunk_size)  # labelled slots only
    slots = (torch.arange(labels.shape[1], device=labels.device) % block_size).expand_as(labels)[scored]  # (N,)
    correct = torch.bincount(slots, weights=hits.float(), minlength=block_size)  # (B,)
    return loss, correct, torch.bincount(slots, minlength=block_size).float()


def build_drafter_config(cfg: TrainConfig, target: Qwen3Config, tokenizer) -> DrafterConfig:
    """The drafter's shape: the target's width (its features and embeddings feed it), its depth our choice."""
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < target.vocab_size:
        raise UsageError(f"--mask-token-id {cfg.mask_token_id} is outside the target's vocabulary "
                         f"(0..{target.vocab_size - 1})")
    mask_token_id = cfg.mask_token_id if cfg.mask_token_id is not None else getattr(tokenizer, "mask_token_id", None)
    if mask_token_id is None:  # the first id past the tokenizer's, as the released drafters use; else the last row
        mask_token_id = min(getattr(tokenizer, "vocab_size", target.vocab_size), target.vocab_size - 1)
    depth = cfg.drafter_layers or DEFAULT_DRAFTER_LAYERS
    layers = replace(target, num_hidden_layers=depth, tie_word_embeddings=False, attention_bias=False,
                     dtype="float32", intermediate_size=cfg.intermediate_size or target.intermediate_size,
                     num_attention_heads=cfg.num_heads or target.num_attention_heads,
                     num_key_value_heads=cfg.num_kv_heads or target.num_key_value_heads,
                     head_dim=cfg.head_dim or target.head_dim)  # the rest is the target's: vocabulary, width, RoPE...
    if layers.num_attention_heads % layers.num_key_value_heads:
        raise UsageError(f"--num-heads {layers.num_attention_heads} is not a multiple of --num-kv-heads "
                         f"{layers.num_key_value_heads}")
    layer_ids = cfg.target_layer_ids or default_target_layer_ids(target.num_hidden_layers, depth)
    config = DrafterConfig(layers, cfg.block_size or DEFAULT_BLOCK_SIZE, target.num_hidden_layers, mask_token_id,
                           list(layer_ids))
    check_fits(config, target, "drafter")
    return config


def shape_of(config: DrafterConfig) -> dict:
    """The options that shape a drafter, as this drafter has them."""
    layers = config.layers
    return {"drafter_layers": layers.num_hidden_layers, "block_size": config.block_size,
            "target_layer_ids": config.target_layer_ids, "mask_token_id": config.mask_token_id,
            "intermediate_size": layers.intermediate_size, "num_heads": layers.num_attention_heads,
            "num_kv_heads": layers.num_key_value_heads, "head_dim": layers.head_dim}


def starting_drafter(cfg: TrainConfig, target: Qwen3, tokenizer) -> Drafter:
    """A new drafter drawn at random, or, with --init-from, a trained one to fine-tune (in float32, trainable): its
    shape is then the run's, so one made for another target, or an option that would reshape it, is refused."""
    if not cfg.init_from:
        return init_drafter(Drafter(build_drafter_config(cfg, target.config, tokenizer)), cfg.seed)
    drafter = Drafter.from_pretrained(cfg.init_from, target, trainable=True)  # checks that it fits the target
    for option, theirs in shape_of(drafter.config).items():
        ours = getattr(cfg, option)
        if ours is not None and ours != theirs:
            raise UsageError(f"--{option.replace('_', '-')} {ours} does not fit the --init-from drafter's "
                             f"{option} {theirs} (leave the option out: the drafter's shape is the run's)")
    return drafter


def evaluate_tau(target: Qwen3, drafter: Drafter, prompts: list, max_new_tokens: int, stop_ids: Sequence[int],
                 place: Distributed = Distributed()) -> float | None:
    """tau by real speculative decoding, greedy: tokens committed per verification step over the prompts, (ids,
    the first token's choices or None) each, and those of every process (a collective call). The drafter runs in
    the target's dtype, as in use."""
    copy = Drafter(drafter.config).to(target.embed_tokens.weight).eval()  # its device and dtype
    copy.load_state_dict(drafter.state_dict())  # cast to the target's dtype
    generations = [generate_dflash(target, copy, ids, max_new_tokens, block_size=drafter.config.block_size,
                                   stop_ids=stop_ids, first_token_choices=choices) for ids, choices in prompts]
    totals = [sum(sum(generation.acceptance_lengths) for generation in generations),
              sum(generation.steps for generation in generations)]
    tokens, verifications = place.sum(torch.tensor(totals, dtype=torch.float64, device=place.device)).tolist()
    return tokens / verifications if verifications else None


def train(cfg: TrainConfig, place: Distributed) -> dict:
    """Train (or resume) this process's share; return the last log record. When due: checkpoint, then log (with an
    evaluation: a failing one never loses the run). Ctrl-C or SIGTERM ends the step, saves, and sets `stopped_by`."""
    out, device = Path(cfg.out), place.device
    if place.main:
        prepare_run_folder(out, cfg.resume, cfg.force, outputs=(LOG_FILE, STATE_FILE, "model.safetensors", "config.json"))
    target = freeze(Qwen3.from_pretrained(cfg.target, device=device, dtype=pick_dtype(cfg.dtype, device)))
    tokenizer_folder = Path(cfg.tokenizer or cfg.target)
    tokenizer = find_tokenizer(tokenizer_folder, required=cfg.tokenizer is not None)
    stop_ids = stop_token_ids(tokenizer_folder, tokenizer)
    drafter = starting_drafter(cfg, target, tokenizer)
    config = drafter.config
    sequences = load_sequences(Path(cfg.data), cfg.max_seq_len, target.config.vocab_size)
    # This process's share of the held-out prompts, rendered (and healed) as make_data.py renders its own.
    prompts = encode_prompts(Path(cfg.eval_prompts), tokenizer, chat=None, thinking=False,
                             token_healing=not cfg.no_token_healing, vocab_size=target.config.vocab_size,
                             )[place.rank::place.world] if cfg.eval_prompts else []
    for index, (ids, _) in enumerate(prompts):  # what the evaluation after training would refuse, refused now
        where = f"{cfg.eval_prompts}: prompt {place.rank + index * place.world + 1}"
        check_request(target, drafter, ids, cfg.eval_max_new_tokens, block_size=config.block_size, where=where)
        check_no_mask_token(drafter, ids, where)
    drafter.recompute_layers = not cfg.keep_activations
    model = wrap_for_training(drafter.to(device).train(), place, cfg.fsdp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    global_batch = cfg.batch_size * place.world * cfg.grad_accum  # sequences per optimizer step
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch(len(sequences), global_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_with_warmup(step, total_steps, cfg.warmup))
    weights = slot_weights(config.block_size, cfg.gamma or gamma_for_block_size(config.block_size))
    run = {"target_config": asdict(target.config), "train_config": vars(cfg), "drafter_config": config.to_dict()}
    step, elapsed_before = 0, 0.0
    if cfg.resume:
        step, elapsed_before = resume(out, run, model, optimizer, scheduler, place, may_change=MAY_CHANGE_ON_RESUME)

    began = last_save = time.perf_counter()
    tally = LogTally.zeros(config.block_size, device)  # since the last log line
    last_step = min(total_steps, cfg.stop_at or total_steps)  # --stop-at ends this job early
    tokens_seen, record, signaled, stopping = 0, {}, False, step >= last_step
    with stop_on_signals() as stop, tqdm(total=total_steps, initial=step, disable=not place.main, unit="step") as bar:
        while not stopping:
            batches = micro_batches(sequences, step, global_batch, cfg, place)
            weight_total = step_weight(batches, weights, place)
            for number, batch in enumerate(batches, start=1):
                with gradient_sync(model, enabled=number == len(batches)):  # reduce once, the sum of them all
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                        loss, correct, counted = drafter_loss(
                            target, model, *batch, config=config, weights=weights, weight_total=weight_total,
                            loss_chunk_size=cfg.loss_chunk_size, dense_attention=cfg.dense_attention)
                    (loss * place.world).backward()  # DDP and FSDP average the processes' gradients: we want the sum
                tally.add(loss, correct, counted)
                tokens_seen += batch.input_ids.numel()
            gradient_norm = apply_gradients(model, optimizer, cfg.grad_clip)
            tally.end_step(gradient_norm)
            scheduler.step()
            step += 1
            bar.update(1)

            seconds = time.perf_counter() - began
            signaled, out_of_time, save_by_clock, diverged = place.any_of(
                stop.name, cfg.minutes is not None and seconds > 60 * cfg.minutes,
                cfg.save_every_minutes > 0 and time.perf_counter() - last_save >= 60 * cfg.save_every_minutes,
                not (torch.isfinite(loss.detach()) & torch.isfinite(gradient_norm)))
            if diverged:  # before anything is logged or saved: the last checkpoint stays the last good one
                raise UsageError(f"step {step}: the loss or its gradient is not finite (loss {loss.item():g}, gradient "
                                 f"norm {gradient_norm.item():g}); stopped without saving (try a lower --lr)")
            stopping = step >= last_step or out_of_time or signaled
            evaluating = bool(cfg.eval_prompts) and not signaled and (
                step == total_steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0))
            if stopping or save_by_clock or (cfg.save_every > 0 and step % cfg.save_every == 0):
                save_checkpoint(out, model, optimizer, scheduler, place,
                                {**run, "step": step, "elapsed": elapsed_before + seconds})
                last_save = time.perf_counter()
            if step % cfg.log_every == 0 or stopping or evaluating:
                record = {"step": step, "sequences": step * global_batch, **tally.pooled(place),
                          "lr": scheduler.get_last_lr()[0], "elapsed": round(elapsed_before + seconds, 2)}
                if evaluating:
                    record["eval_tau"] = evaluate_tau(target, unwrap(model), prompts, cfg.eval_max_new_tokens,
                                                    stop_ids, place)
                if place.main:
                    write_log(out / LOG_FILE, record, bar, place.world * tokens_seen / max(seconds, 1e-9))
    if signaled:
        record["stopped_by"] = stop.name or "SIGTERM"  # another process's signal: a scheduler's, as a rule
    return record


zero_or_more = checked(int, "0 or more", lambda x: x >= 0)


def build_parser() -> argparse.ArgumentParser:
    """Every option of a run and its default: the whole configuration, saved with the run (`TrainConfig`)."""
    parser = OneLineErrors(description="Train a DFlash drafter for a frozen Qwen3 target.", epilog=(
        f"--eval-prompts: {PROMPT_FORMAT}\n\nCtrl-C or SIGTERM saves and exits (130 / 143). Examples, torchrun, "
        "memory, the log: docs/training.md."), formatter_class=HelpWithDefaults)
    add = parser.add_argument
    add("--target", required=True, help="the frozen target's checkpoint folder")
    add("--data", required=True, help="JSONL written by make_data.py: input_ids and loss_mask per line")
    add("--out", required=True, help="folder for the drafter, training_state.pt and train_log.jsonl")
    add("--tokenizer", help="tokenizer folder (default: the target's, if it has one)")
    add("--init-from", help="fine-tune this trained drafter (ours or the authors' layout) instead of drawing a new "
                            "one: its shape (layers, block size, target layers, mask token) is the run's")
    add("--drafter-layers", type=positive_int,
        help=f"decoder layers of the drafter (default: {DEFAULT_DRAFTER_LAYERS})")
    add("--block-size", type=checked(int, "at least 2", lambda x: x >= 2),
        help=f"B, tokens per block: slot 0 is the known token, slots 1..B-1 guessed (default: {DEFAULT_BLOCK_SIZE})")
    add("--target-layer-ids", type=int_list,
        help="target layers whose outputs feed the drafter, e.g. 1,9,17,25,33 (default: spread over the target)")
    add("--mask-token-id", type=int, help="the unknown slots' token (default: <|mask|>, else len(tokenizer))")
    add("--intermediate-size", type=positive_int, help="drafter MLP width (default: the target's)")
    add("--num-heads", type=positive_int, help="drafter query heads (default: the target's)")
    add("--num-kv-heads", type=positive_int, help="drafter key/value heads (default: the target's)")
    add("--head-dim", type=positive_int, help="drafter head width (default: the target's)")
    add("--num-anchors", type=positive_int, default=512, help="blocks per sequence per step, at most one per anchor")
    add("--batch-size", type=positive_int, default=4, help="sequences per forward pass and per process")
    add("--grad-accum", type=positive_int, default=1, help="forward passes per optimizer step: a step trains on "
                                                           "batch-size x processes x grad-accum sequences")
    add("--max-seq-len", type=positive_int, default=3072, help="longer sequences are cut")
    add("--lr", type=positive, default=6e-4, help="peak learning rate (AdamW)")
    add("--warmup", type=checked(float, "in [0, 1]", lambda x: 0 <= x <= 1), default=0.04,
        help="fraction of the steps warming up, then cosine down to 0")
    add("--grad-clip", type=positive, default=1.0, help="gradient norm clip")
    add("--gamma", type=positive, help="loss decay over the slots (default: 7 for B=16, 5 for B=10, 4 for B=8)")
    add("--epochs", type=positive_int, default=6, help="passes over the data")
    add("--steps", type=positive_int, help="train this many steps (overrides --epochs)")
    add("--seed", type=int, default=0, help="seeds the drafter's initialisation, the data order and the anchors")
    add("--loss-chunk-size", type=zero_or_more, default=512,
        help="slots per chunk of the LM-head loss (0: all at once)")
    add("--keep-activations", action="store_true", help="keep each drafter layer's activations for the backward "
                                                        "pass, not recompute them (faster, much more memory)")
    add("--dense-attention", action="store_true", help="attend under a dense mask, not skipping masked blocks")
    add("--eval-prompts", help="held-out prompt file: real speculative decoding, greedy, mean tau")
    add("--eval-every", type=zero_or_more, default=0, help="steps between evaluations (0: only at the end)")
    add("--eval-max-new-tokens", type=positive_int, default=128, help="tokens decoded per held-out prompt")
    add("--no-token-healing", action="store_true", help="evaluate raw-text prompts unhealed (as the data was made)")
    add("--save-every", type=zero_or_more, default=0, help="steps between checkpoints (0: at the end and by the clock)")
    add("--save-every-minutes", type=checked(float, "0 or more", lambda x: x >= 0), default=10.0,
        help="also checkpoint when this many minutes have passed since the last one (0: off)")
    add("--log-every", type=positive_int, default=10, help="steps between log lines")
    add("--minutes", type=positive, help="stop (and save) after this much wall-clock time")
    add("--stop-at", type=positive_int, help="stop (and save) after this step, e.g. to split a run across jobs")
    either = parser.add_mutually_exclusive_group()
    either.add_argument("--resume", action="store_true", help="continue the run in --out exactly")
    either.add_argument("--force", action="store_true", help="start over even though --out is not empty")
    add("--fsdp", action="store_true", help="under torchrun: shard the drafter (FSDP2) instead of replicating it")
    add_device_options(parser)  # --dtype is the frozen target's: the drafter trains in float32
    return parser


class TrainConfig(argparse.Namespace):
    """A run's whole configuration: `build_parser`'s defaults, but for the options given."""

    def __init__(self, **options):
        defaults = vars(build_parser().parse_args(["--target=", "--data=", "--out="]))  # the required ones: ""
        if options.keys() - defaults.keys():
            raise TypeError(f"no option {sorted(options.keys() - defaults.keys())[0]!r}")
        super().__init__(**{**defaults, **options})


def train_from_args(args: argparse.Namespace) -> int:
    """Train as the command line says; a run stopped by a signal exits as the shell expects (130 for Ctrl-C)."""
    if args.fsdp and args.eval_prompts:
        raise UsageError("--eval-prompts is not supported with --fsdp (evaluate the saved drafter with generate.py)")
    with distributed_run(args.device) as place:
        record = train(TrainConfig(**vars(args)), place)
    if "stopped_by" not in record:
        return 0
    if place.main:  # one line, however many processes
        print(f"stopped by {record['stopped_by']} at step {record['step']}: checkpoint saved in {args.out}; "
              f"to continue, run the same command with --resume", file=sys.stderr)
    return 128 + signal.Signals[record["stopped_by"]].value


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when trained, 2 (and one `error:` line) on bad input."""
    return run_cli(build_parser(), train_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
