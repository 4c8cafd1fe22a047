"""Train a DFlash drafter for a frozen Qwen3 target, from scratch.

The recipe, in the order this file follows it:

1. **Data** (`make_data.py`, run first). The drafter must predict what *the target*
   would say, so it trains on the target's own answers to a dataset's prompts: each
   record holds `input_ids` (prompt + answer) and `loss_mask` (1 on answer tokens).
2. **Context features.** Every step, the frozen target reads each training sequence
   once and hands over its hidden states after `target_layer_ids`: the context the
   drafter is conditioned on, exactly as at inference.
3. **Anchors and blocks.** Each step picks fresh random anchor positions `a` inside
   the answers. Anchor `a` makes the block `[x_a, MASK, ..., MASK]` at positions
   a..a+B-1, which is what the drafter sees at inference right after x_a is verified.
4. **One forward for all blocks.** All blocks of a sequence are concatenated and run
   at once; a mask keeps them apart: block j sees the context strictly before a_j and
   all of its own block (both directions), nothing of any other block. As a dense
   mask most of it is "no"; `AnchoredBlocks` skips those regions instead of scoring them.
5. **Loss.** Slot k = 1..B-1 predicts x_{a+k} through the target's frozen LM head;
   slot 0 is the known token and carries no loss. Early slots matter most (a draft is
   only accepted up to its first mistake), so slot k is weighted exp(-(k-1)/gamma).
   Over Qwen3's 151,936-token vocabulary the logits of every slot would not fit, so
   the loss runs a chunk of slots at a time (`chunked_lm_head_loss`).

Then the loop: a training step, a log line, a checkpoint, an evaluation by real
speculative decoding. Only the drafter trains. The same script runs data-parallel
under `torchrun` (DDP, or FSDP2 with --fsdp); Ctrl-C or SIGTERM saves before it
exits, a checkpoint is written every 10 minutes anyway, and `--resume` continues bit
for bit. The recipe at real scale: docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from dflash.checkpoint import write_atomically
from dflash.cli import (PROMPT_FORMAT, OneLineErrors, UsageError, add_device_options, find_tokenizer, numbered_lines,
                        parse_json_line, pick_dtype, run_cli, stop_token_ids)
from dflash.drafter import Drafter, DrafterConfig, check_fits, default_target_layer_ids
from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.train_kernels import AnchoredBlocks, chunked_lm_head_loss
from dflash.training import (Distributed, add_config_options, cosine_with_warmup, distributed_run, epoch_order, every,
                             full_state, load_full_state, load_training_state, optimizer_step, option,
                             prepare_run_folder, restore_rng_states, rng_states, save_training_state,
                             stop_on_signals, unwrap, wrap_for_training)
from generate import generate_dflash
from make_data import encode_prompts

IGNORE = -100  # cross_entropy's ignore_index: this slot has no label


# ------------------------------------------------------------------------ the config


@dataclass
class TrainConfig:
    """Everything that shapes a training run; `build_parser` makes one option of each field."""

    target: str = option("", "the frozen target's checkpoint folder", required=True)
    data: str = option("", "JSONL written by make_data.py: input_ids and loss_mask per line", required=True)
    out: str = option("", "folder for the drafter, training_state.pt and train_log.jsonl", required=True)
    tokenizer: str | None = option(None, "tokenizer folder (default: the target's, if it has one)")
    # the drafter
    drafter_layers: int = option(5, "decoder layers of the drafter")
    block_size: int = option(16, "B, tokens per block: slot 0 is the known token, slots 1..B-1 are guessed")
    target_layer_ids: list[int] | None = option(
        None, "target layers whose outputs feed the drafter, e.g. 1,9,17,25,33 (default: spread over the target)")
    mask_token_id: int | None = option(
        None, "the token of the unknown slots (default: the tokenizer's <|mask|>, else len(tokenizer), "
            "the first padding row)")
    intermediate_size: int | None = option(None, "drafter MLP width (default: the target's)")
    num_heads: int | None = option(None, "drafter query heads (default: the target's)")
    num_kv_heads: int | None = option(None, "drafter key/value heads (default: the target's)")
    head_dim: int | None = option(None, "drafter head width (default: the target's)")
    # the data
    num_anchors: int = option(512, "blocks per sequence per step (fewer if it has fewer valid anchors)")
    batch_size: int = option(4, "sequences per step and per process")
    max_seq_len: int = option(3072, "longer sequences are cut")
    # memory: the dense ways, kept as references (dflash/train_kernels.py)
    loss_chunk_size: int = option(512, "slots per chunk of the LM-head loss (0: all at once, the dense reference)")
    keep_activations: bool = option(False, "keep every drafter layer's activations for the backward pass "
                                           "instead of recomputing them (a little faster, much more memory)")
    dense_attention: bool = option(False, "attend under a dense (K*B) x (S+K*B) mask instead of skipping "
                                          "masked blocks (the reference; slow)")
    # the optimisation
    lr: float = option(6e-4, "peak learning rate (AdamW)")
    warmup: float = option(0.04, "fraction of the steps spent warming up, then cosine down to zero")
    grad_clip: float = option(1.0, "gradient norm clip")
    gamma: float | None = option(None, "loss decay over the slots (default: 7 for B=16, 5 for B=10, 4 for B=8)")
    epochs: int = option(1, "passes over the data")
    steps: int | None = option(None, "train this many steps (overrides --epochs)")
    minutes: float | None = option(None, "stop (and save) after this much wall-clock time")
    stop_at: int | None = option(None, "stop (and save) after this step, e.g. to split a run across jobs")
    seed: int = option(0, "seeds the drafter's initialisation, the data order and the anchors")
    # evaluation, checkpoints, logging
    eval_prompts: str | None = option(None, "held-out prompt file: real speculative decoding, greedy, mean tau")
    eval_every: int = option(0, "steps between evaluations (0: only at the end)")
    eval_max_new_tokens: int = option(128, "tokens decoded per held-out prompt")
    no_token_healing: bool = option(False, "evaluate raw-text prompts unhealed (data made with the same option)")
    save_every: int = option(0, "steps between checkpoints (0: only at the end and by the clock)")
    save_every_minutes: float = option(10.0, "also checkpoint when this many minutes have passed since the last "
                                             "one (0: off); a killed run loses at most that much")
    log_every: int = option(10, "steps between log lines")
    resume: bool = option(False, "continue the run in --out exactly")
    force: bool = option(False, "start over even though --out is not empty")
    fsdp: bool = option(False, "under torchrun: shard the drafter (FSDP2) instead of replicating it (DDP)")
    # where to run, spelled as in every program of the project (cli.add_device_options)
    device: str = "auto"
    dtype: str = "auto"  # the frozen target's; the drafter trains in float32 (under bf16 autocast on CUDA)


DEVICE_OPTIONS = ("device", "dtype")

# The options a --resume may change: when to stop, what to log and evaluate, where to run. Every other
# option shapes the result, and the saved run's value must match (`load_resume_state`).
MAY_CHANGE_ON_RESUME = ("resume", "force", "minutes", "stop_at", "eval_prompts", "eval_every",
                        "eval_max_new_tokens", "save_every", "save_every_minutes", "log_every", "device")


def gamma_for_block_size(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8; linear in between, proportional outside."""
    if block_size < 8:
        return block_size / 2
    if block_size > 16:
        return 7.0 * block_size / 16
    return float(np.interp(block_size, [8, 10, 16], [4.0, 5.0, 7.0]))


# ---------------------------------------------------------------------- the dataset


def load_sequences(path: Path, max_seq_len: int, vocab_size: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) pairs, cut to max_seq_len; sequences where no block can start are dropped."""
    sequences = []
    for where, line in numbered_lines(path, "data file"):
        record = parse_json_line(line, where)
        ids, mask = (record.get("input_ids"), record.get("loss_mask")) if isinstance(record, dict) else (None, None)
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise UsageError(f"{where}: needs input_ids and loss_mask lists of equal length")
        if any(not isinstance(i, int) or not 0 <= i < vocab_size for i in ids):
            raise UsageError(f"{where}: input_ids must be integers in 0..{vocab_size - 1}")
        ids, mask = ids[:max_seq_len], [int(bool(m)) for m in mask[:max_seq_len]]
        if len(valid_anchor_positions(torch.tensor(mask))):
            sequences.append((ids, mask))
    if not sequences:
        raise UsageError(f"{path}: the dataset yields no valid block (no two answer tokens in a row "
                         f"within --max-seq-len {max_seq_len})")
    return sequences


def collate(sequences: list[tuple[list[int], list[int]]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest: (batch, S) ids and loss mask. Padding has mask 0, so no anchor or label reaches it."""
    longest = max(len(ids) for ids, _ in sequences)
    input_ids = torch.zeros(len(sequences), longest, dtype=torch.long)  # (batch, S)
    loss_mask = torch.zeros(len(sequences), longest, dtype=torch.long)  # (batch, S)
    for row, (ids, mask) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        loss_mask[row, : len(mask)] = torch.tensor(mask)
    return input_ids.to(device), loss_mask.to(device)


# ------------------------------------------------------------------ anchors, blocks


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a (of one sequence) where a block may start: x_a and x_{a+1} are both answer tokens.

    These are the blocks inference drafts. The prefill already yields the answer's
    first token, so the first block starts *at* it; a block anchored at the prompt's
    last token is never drafted. Slot 1 (x_{a+1}) must be an answer token too, or the
    block has nothing to learn.
    """
    answer = loss_mask == 1
    return (answer[:-1] & answer[1:]).nonzero()[:, 0]  # (n,): a such that a + 1 < S


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `num_anchors` distinct valid anchors, uniformly without replacement, sorted."""
    valid = valid_anchor_positions(loss_mask)
    picks = torch.randperm(len(valid), generator=generator)[:num_anchors]
    return valid[picks.to(valid.device)].sort().values


def batch_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator):
    """Anchors for every row, padded to the batch's largest count: (batch, K) positions and (batch, K) is-real."""
    per_row = [sample_anchors(row.cpu(), num_anchors, generator) for row in loss_mask]
    count = max(len(a) for a in per_row)
    anchors = torch.zeros(len(per_row), count, dtype=torch.long)  # (batch, K); padding blocks sit at 0
    real = torch.zeros(len(per_row), count, dtype=torch.bool)  # (batch, K)
    for row, picked in enumerate(per_row):
        anchors[row, : len(picked)] = picked
        real[row, : len(picked)] = True
    return anchors.to(loss_mask.device), real.to(loss_mask.device)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block j occupies positions a_j .. a_j+B-1: (batch, K*B)."""
    batch, count = anchors.shape
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).reshape(batch, count * block_size)  # (batch, K, B) -> (batch, K*B)


def block_input_ids(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """[x_a, MASK, ..., MASK] for every anchor: (batch, K*B)."""
    batch, count = anchors.shape
    blocks = torch.full((batch, count, block_size), mask_token_id, dtype=torch.long, device=anchors.device)
    blocks[:, :, 0] = input_ids.gather(1, anchors)  # (batch, K): the known token
    return blocks.reshape(batch, count * block_size)  # (batch, K, B) -> (batch, K*B)


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, real: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Slot k of the block at a is labelled x_{a+k}: same position, no shift. (batch, K*B), IGNORE where no loss.

    No loss on slot 0 (the known token), past the sequence's end, outside the loss
    mask (prompt or padding), or on the padding blocks of short rows.
    """
    batch, length = input_ids.shape
    positions = block_positions(anchors, block_size)  # (batch, K*B)
    inside = positions < length
    clamped = positions.clamp(max=length - 1)
    labels = input_ids.gather(1, clamped)  # (batch, K*B)
    keep = inside & (loss_mask.gather(1, clamped) == 1)
    keep &= (torch.arange(positions.shape[1], device=anchors.device) % block_size != 0)[None]  # not slot 0
    keep &= real.repeat_interleave(block_size, dim=1)  # (batch, K) -> (batch, K*B)
    return torch.where(keep, labels, IGNORE)


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1, and 0 for slot 0: (B,)."""
    k = torch.arange(block_size, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


# ------------------------------------------------------------------------ the loss


def drafter_loss(target: Qwen3, drafter: nn.Module, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                 anchors: torch.Tensor, real: torch.Tensor, config: DrafterConfig, weights: torch.Tensor,
                 loss_chunk_size: int = 512, dense_attention: bool = False):
    """Weighted cross-entropy of every block slot, plus per-slot hit counts for the logs.

    The attention runs under the `AnchoredBlocks` pattern (or, with `dense_attention`,
    its dense mask) and the loss `loss_chunk_size` slots at a time (0: all at once):
    the dense ways are kept as the reference the fast ones are tested against.
    Returns (loss, correct (B,), counted (B,)).
    """
    block_size = config.block_size
    with torch.no_grad():  # the frozen target: its features are an input, not part of the graph
        _, features = target(input_ids, capture_layers=config.target_layer_ids,
                             last_layer=max(config.target_layer_ids))  # no layer past the last one read
        block_embeddings = target.embed_tokens(block_input_ids(input_ids, anchors, block_size, config.mask_token_id))
    context_positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
    pattern = AnchoredBlocks(anchors, input_ids.shape[1], block_size)
    positions = block_positions(anchors, block_size)
    if dense_attention:
        hidden = drafter(features, block_embeddings, context_positions, positions, mask=pattern.dense_mask())
    else:
        hidden = drafter(features, block_embeddings, context_positions, positions, pattern=pattern)
    labels = block_labels(input_ids, loss_mask, anchors, real, block_size)  # (batch, K*B)
    scored = labels != IGNORE
    slots = (torch.arange(labels.shape[1], device=labels.device) % block_size).expand_as(labels)[scored]  # (N,)
    slot_weight = weights.to(hidden.device)[slots]  # (N,)
    # Only slots with a label reach the LM head; their weights sum to 1, so the loss is a weighted mean.
    loss, hits = chunked_lm_head_loss(hidden[scored], target.head_weight, labels[scored],
                                      slot_weight / slot_weight.sum(), loss_chunk_size)
    correct = torch.bincount(slots, weights=hits.float(), minlength=block_size)  # (B,)
    counted = torch.bincount(slots, minlength=block_size).float()  # (B,)
    return loss, correct, counted


def estimated_tau(correct: torch.Tensor, counted: torch.Tensor) -> float:
    """A cheap stand-in for the real tau: 1 + sum_k prod_{i<=k} acc_i over slots 1..B-1.

    A draft is accepted up to its first miss, so slot k counts only when slots 1..k all
    hit. We multiply the slots' *unconditional* accuracies as if the hits were
    independent; they are positively correlated in practice (an easy stretch is easy
    throughout), so this tends to underestimate. Use --eval-prompts for the real value.
    """
    accuracy = correct[1:] / counted[1:].clamp(min=1)
    return 1.0 + torch.cumprod(accuracy, dim=0).sum().item()


# --------------------------------------------------------------- model construction


def build_drafter_config(cfg: TrainConfig, target: Qwen3Config, tokenizer) -> DrafterConfig:
    """The drafter's shape: the target's width (its features and embeddings feed it), its depth our choice."""
    if cfg.mask_token_id is not None:
        mask_token_id = cfg.mask_token_id
    elif tokenizer is not None and tokenizer.mask_token_id is not None:
        mask_token_id = tokenizer.mask_token_id
    elif tokenizer is not None and tokenizer.vocab_size < target.vocab_size:
        mask_token_id = tokenizer.vocab_size  # the first padding row past the tokenizer, as the released drafters use
    else:
        mask_token_id = target.vocab_size - 1  # no tokenizer: the last embedding row, never produced
    if not 0 <= mask_token_id < target.vocab_size:
        raise UsageError(f"--mask-token-id {mask_token_id} is outside the target's vocabulary "
                         f"(0..{target.vocab_size - 1})")
    layer_ids = cfg.target_layer_ids or default_target_layer_ids(target.num_hidden_layers, cfg.drafter_layers)
    layers = Qwen3Config(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        intermediate_size=cfg.intermediate_size or target.intermediate_size,
        num_hidden_layers=cfg.drafter_layers,
        num_attention_heads=cfg.num_heads or target.num_attention_heads,
        num_key_value_heads=cfg.num_kv_heads or target.num_key_value_heads,
        head_dim=cfg.head_dim or target.head_dim, rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        max_position_embeddings=target.max_position_embeddings, dtype="float32",
    )
    if layers.num_attention_heads % layers.num_key_value_heads:
        raise UsageError(f"--num-heads {layers.num_attention_heads} is not a multiple of --num-kv-heads "
                         f"{layers.num_key_value_heads}")
    config = DrafterConfig(layers, cfg.block_size, target.num_hidden_layers, mask_token_id, list(layer_ids))
    check_fits(config, target, "drafter")
    return config


def init_drafter(drafter: Drafter, seed: int) -> None:
    """Linear weights ~ N(0, 0.02), norms 1, biases 0: the Qwen3 initialisation, from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


def freeze(target: Qwen3) -> Qwen3:
    """The target (embedding and LM head included) never trains."""
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    return target.eval()


# ------------------------------------------------------------------- checkpoint files


def save_checkpoint(out: Path, drafter_config: DrafterConfig, weights: dict, state: dict) -> None:
    """The drafter in the released DFlash layout, and `training_state.pt` to resume from.

    `training_state.pt` holds the weights too, so it is self-contained: both files are
    written atomically, but a crash between the two writes must never pair one step's
    weights with another step's optimizer.
    """
    release = Drafter(drafter_config)
    release.load_state_dict(weights)
    release.save_pretrained(out)
    save_training_state(out / "training_state.pt", {**state, "model": weights})


def load_resume_state(out: Path, target: Qwen3Config, cfg: TrainConfig, drafter: DrafterConfig) -> dict:
    """`training_state.pt`, if it continues this run: the same target, options and drafter shape.

    The drafter's config is compared too: what it is conditioned on (target layers, mask
    token) can also change through a default or the tokenizer, not only through an option.
    """
    path = out / "training_state.pt"
    state = load_training_state(path)
    if state["target_config"] != asdict(target):
        changed = next(k for k, v in asdict(target).items() if state["target_config"].get(k) != v)
        raise UsageError(f"{path}: trained for another target ({changed}={state['target_config'].get(changed)!r}, "
                         f"this target has {asdict(target)[changed]!r})")
    saved = state["train_config"]
    for name, value in asdict(cfg).items():
        if name not in MAY_CHANGE_ON_RESUME and saved.get(name) != value:
            raise UsageError(f"--resume: {name} was {saved.get(name)!r}, now {value!r} (keep it the same)")
    for name, value in drafter.to_dict().items():
        if state["drafter_config"].get(name) != value:
            raise UsageError(f"--resume: the drafter's {name} was {state['drafter_config'].get(name)!r}, "
                             f"now {value!r} (keep it the same)")
    return state


def forget_log_after(log: Path, step: int) -> None:
    """Drop the log lines of steps after the checkpoint a resume starts from: they are about to be redone."""
    if log.is_file():
        kept = [line for line in log.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        write_atomically(log, lambda tmp: Path(tmp).write_text("".join(line + "\n" for line in kept)))


# ----------------------------------------------------------------------- evaluation


def evaluate_tau(target: Qwen3, drafter: Drafter, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int, stop_ids: Sequence[int],
                 first_token_choices: Sequence[list[int] | None] | None = None) -> tuple[float, float]:
    """Real speculative decoding, greedy: (tokens committed, verification steps) summed over prompts.

    tau = tokens / steps. The drafter runs in the target's dtype, as it would in use
    (loaded from its checkpoint: RoPE's frequencies stay float32, see `RotaryEmbedding`);
    `first_token_choices[i]` restricts prompt i's first new token (token healing).
    """
    weight = target.embed_tokens.weight
    copy = Drafter(drafter.config).to(device=weight.device)
    copy.load_state_dict(drafter.state_dict())
    copy = copy.to(dtype=weight.dtype).eval()
    copy.rotary.inv_freq = copy.rotary.inverse_frequencies(weight.device)  # `.to(bf16)` rounded them
    tokens = steps = 0
    for prompt, choices in zip(prompts, first_token_choices or [None] * len(prompts)):
        result = generate_dflash(target, copy, prompt, max_new_tokens, block_size=block_size, stop_ids=stop_ids,
                                 first_token_choices=choices)
        tokens += sum(result.acceptance_lengths)
        steps += result.steps
    return float(tokens), float(steps)


# ----------------------------------------------------------------------- the run


class Run:
    """A training run in progress: the frozen target, the drafter and its optimiser, the data, the clock.

    Its methods are the parts of the loop (`train_loop` below), in the order it calls
    them: `next_batch`, `train_step`, `log_record`, `save`, `evaluate`, `write_log`.
    """

    def __init__(self, cfg: TrainConfig, place: Distributed):
        """Load the target and the data, build the drafter, its optimiser and schedule; resume if asked."""
        if place.main:
            prepare_run_folder(Path(cfg.out), cfg.resume, cfg.force, outputs=("train_log.jsonl", "training_state.pt"))
        if cfg.fsdp and cfg.eval_prompts:
            raise UsageError("--eval-prompts is not supported with --fsdp "
                             "(evaluate the saved drafter with generate.py)")
        self.cfg, self.place, self.out, device = cfg, place, Path(cfg.out), place.device
        self.target = freeze(Qwen3.from_pretrained(cfg.target, device=device, dtype=pick_dtype(cfg.dtype, device)))
        vocab_size = self.target.config.vocab_size
        tokenizer_folder = Path(cfg.tokenizer or cfg.target)
        tokenizer = find_tokenizer(tokenizer_folder, required=cfg.tokenizer is not None)
        self.stop_ids = stop_token_ids(tokenizer_folder, tokenizer)
        self.drafter_config = build_drafter_config(cfg, self.target.config, tokenizer)
        self.sequences = load_sequences(Path(cfg.data), cfg.max_seq_len, vocab_size)
        # This process's share of the held-out prompts, rendered (and healed) as make_data.py renders its own.
        prompts = encode_prompts(Path(cfg.eval_prompts), tokenizer, None, False, not cfg.no_token_healing,
                                 vocab_size)[place.rank::place.world] if cfg.eval_prompts else []
        self.eval_prompts = [ids for ids, _ in prompts]
        self.eval_choices = [choices for _, choices in prompts]  # the first token's, where token healing applies
        drafter = Drafter(self.drafter_config)
        init_drafter(drafter, cfg.seed)
        drafter.recompute_layers = not cfg.keep_activations
        self.model = wrap_for_training(drafter.to(device).train(), place, cfg.fsdp)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        share = len(epoch_order(len(self.sequences), 0, cfg.seed, place.rank, place.world))
        self.steps_per_epoch = math.ceil(share / cfg.batch_size)
        self.total_steps = cfg.steps or cfg.epochs * self.steps_per_epoch
        schedule = cosine_with_warmup(self.total_steps, cfg.warmup)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.anchor_generator = torch.Generator().manual_seed(cfg.seed * 7919 + place.rank)
        self.slot_weights = slot_weights(cfg.block_size, cfg.gamma or gamma_for_block_size(cfg.block_size))
        self.step, self.elapsed_before, self.began = 0, 0.0, time.perf_counter()
        self.last_save = self.began
        # What the steps since the last log line measured: loss (at [0, 0]), per-slot hits, per-slot counts.
        self.sums = torch.zeros(3, cfg.block_size, device=device)
        self.steps_since_log = self.tokens_seen = 0
        if cfg.resume:
            self.resume()

    def resume(self) -> None:
        """Put the run back where its last checkpoint left it: weights, optimiser, schedule, anchors, clock."""
        state = load_resume_state(self.out, self.target.config, self.cfg, self.drafter_config)
        if len(state["rng"]) != self.place.world:
            raise UsageError(f"--resume: the run used {len(state['rng'])} process(es), this one {self.place.world} "
                             f"(an exact resume needs the same number)")
        load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], self.cfg.fsdp)
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_states(state["rng"][self.place.rank], anchors=self.anchor_generator)
        self.step, self.elapsed_before = state["step"], state["elapsed"]
        if self.place.main:
            forget_log_after(self.out / "train_log.jsonl", self.step)

    def minutes_since_save(self) -> float:
        return (time.perf_counter() - self.last_save) / 60

    def seconds(self) -> float:
        """Wall-clock time of this session (not of the sessions it resumes)."""
        return time.perf_counter() - self.began

    def next_batch(self) -> list[tuple[list[int], list[int]]]:
        """This process's sequences for the coming step: the next slice of its share of the epoch."""
        epoch, index = divmod(self.step, self.steps_per_epoch)
        order = epoch_order(len(self.sequences), epoch, self.cfg.seed, self.place.rank, self.place.world)
        size = self.cfg.batch_size
        return [self.sequences[i] for i in order[index * size:(index + 1) * size]]

    def train_step(self, batch: list[tuple[list[int], list[int]]]) -> None:
        """One optimiser step: fresh anchors, the loss of their blocks, backward, clip, update."""
        input_ids, loss_mask = collate(batch, self.place.device)
        anchors, real = batch_anchors(loss_mask, self.cfg.num_anchors, self.anchor_generator)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.place.device.type == "cuda"):
            loss, correct, counted = drafter_loss(self.target, self.model, input_ids, loss_mask, anchors, real,
                                                  self.drafter_config, self.slot_weights, self.cfg.loss_chunk_size,
                                                  self.cfg.dense_attention)
        optimizer_step(loss, self.model, self.optimizer, self.cfg.grad_clip, self.scheduler)
        self.step += 1
        self.sums[0, 0] += loss.detach()
        self.sums[1] += correct
        self.sums[2] += counted
        self.steps_since_log += 1
        self.tokens_seen += sum(len(ids) for ids, _ in batch)

    def log_record(self) -> dict:
        """What the steps since the last record measured, pooled over all processes (a collective call)."""
        totals = self.place.sum(self.sums.clone())
        accuracy = (totals[1, 1:] / totals[2, 1:].clamp(min=1)).tolist()
        record = {"step": self.step, "loss": totals[0, 0].item() / self.place.world / self.steps_since_log,
                  "slot_accuracy": [round(a, 4) for a in accuracy],
                  "tau_estimate": round(estimated_tau(totals[1], totals[2]), 4),
                  "lr": self.scheduler.get_last_lr()[0], "elapsed": round(self.elapsed_before + self.seconds(), 2)}
        self.sums.zero_()
        self.steps_since_log = 0
        return record

    def save(self) -> None:
        """Checkpoint: the released drafter layout plus all that `--resume` needs (a collective call)."""
        weights, optimizer_state = full_state(self.model, self.optimizer, self.cfg.fsdp)
        rng = self.place.gather(rng_states(anchors=self.anchor_generator))  # every process's anchor sampler
        self.last_save = time.perf_counter()
        if self.place.main:
            state = {"step": self.step, "elapsed": self.elapsed_before + self.seconds(),
                     "optimizer": optimizer_state, "scheduler": self.scheduler.state_dict(), "rng": rng,
                     "target_config": asdict(self.target.config), "train_config": asdict(self.cfg),
                     "drafter_config": self.drafter_config.to_dict()}
            save_checkpoint(self.out, self.drafter_config, weights, state)

    def evaluate(self) -> float | None:
        """Real speculative decoding of the held-out prompts; tau pooled over every process's share."""
        totals = evaluate_tau(self.target, unwrap(self.model), self.eval_prompts, self.cfg.eval_max_new_tokens,
                              self.cfg.block_size, self.stop_ids, self.eval_choices)
        tokens, steps = self.place.sum(torch.tensor(totals, device=self.place.device)).tolist()
        return tokens / steps if steps else None

    def write_log(self, record: dict, bar: tqdm) -> None:
        """Append the record to train_log.jsonl and show it on the progress bar (the main process only)."""
        if not self.place.main:
            return
        with open(self.out / "train_log.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        accuracy = record["slot_accuracy"]
        postfix = {"loss": f"{record['loss']:.3f}", "acc1": f"{accuracy[0]:.2f}",
                   "acc_mean": f"{sum(accuracy) / len(accuracy):.2f}", "tau~": f"{record['tau_estimate']:.2f}",
                   "tok/s": f"{self.place.world * self.tokens_seen / max(self.seconds(), 1e-9):.0f}"}
        if record.get("eval_tau") is not None:
            postfix["eval_tau"] = f"{record['eval_tau']:.2f}"
        bar.set_postfix(postfix)


def run_training(cfg: TrainConfig) -> dict:
    """Train (or resume), checkpoint, log, in this process's place of the job. Returns the last log record."""
    with distributed_run(cfg.device) as place:
        return train_loop(cfg, place)


def train_loop(cfg: TrainConfig, place: Distributed) -> dict:
    """Step until done; log, save and evaluate when due, saving *before* evaluating.

    Ctrl-C or SIGTERM ends the step under way, saves, and returns a record saying
    which signal stopped the run (`stopped_by`); nothing is lost but that step's wait.
    """
    run = Run(cfg, place)
    bar = tqdm(total=run.total_steps, initial=run.step, disable=not place.main, unit="step")
    record: dict = {}
    signaled = False
    with stop_on_signals() as stop:
        while run.step < run.total_steps:
            run.train_step(run.next_batch())
            bar.update(1)
            signaled, out_of_time, save_by_clock = place.any_of(
                stop.requested, cfg.minutes is not None and run.seconds() > 60 * cfg.minutes,
                cfg.save_every_minutes > 0 and run.minutes_since_save() >= cfg.save_every_minutes)
            stopping = run.step in (run.total_steps, cfg.stop_at) or out_of_time or signaled
            evaluating = (bool(cfg.eval_prompts) and not signaled
                          and (run.step == run.total_steps or every(run.step, cfg.eval_every)))
            logging = every(run.step, cfg.log_every) or stopping or evaluating
            if logging:
                record = run.log_record()
            if stopping or every(run.step, cfg.save_every) or save_by_clock:
                run.save()  # first: an evaluation that fails must not lose the run
            if evaluating:
                record["eval_tau"] = run.evaluate()
            if logging:
                run.write_log(record, bar)
            if stopping:
                break
    bar.close()
    if signaled:
        record["stopped_by"] = stop.name or "SIGTERM"  # another process's signal: a scheduler's, as a rule
    return record


# ------------------------------------------------------------------ the command line


EXAMPLES = f"""\
examples:
  # 1. let the target answer the prompts (see make_data.py --help)
  python make_data.py --target weights/Qwen3-8B --prompts prompts.jsonl --out data.jsonl
  # 2. train a 5-layer, block-16 drafter on those answers
  python train.py --target weights/Qwen3-8B --data data.jsonl --out runs/dflash \\
      --eval-prompts heldout.jsonl --eval-every 1000 --save-every 1000
  # continue after an interruption, bit for bit
  python train.py --target weights/Qwen3-8B --data data.jsonl --out runs/dflash --resume
  # data-parallel on 8 GPUs
  torchrun --nproc_per_node=8 train.py --target weights/Qwen3-8B --data data.jsonl --out runs/dflash

--eval-prompts: {PROMPT_FORMAT}

Ctrl-C or SIGTERM: the step finishes, a checkpoint is saved, and the run exits
(status 130 / 143) with one line saying how to --resume.

The recipe for real Qwen3 targets (data from vLLM/SGLang, torchrun, memory, pitfalls):
docs/training.md.

OUT receives config.json + model.safetensors (the released DFlash layout, loadable by
generate.py --draft OUT), training_state.pt (to --resume) and train_log.jsonl (one
JSON object per logged step: step, loss, slot_accuracy, tau_estimate, lr, elapsed, eval_tau).
Bad input exits with status 2 and one line on stderr.
"""


def build_parser() -> argparse.ArgumentParser:
    """One option per TrainConfig field: its name, type, default and help all come from the dataclass."""
    parser = OneLineErrors(description="Train a DFlash drafter for a frozen Qwen3 target.",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(parser, TrainConfig, skip=DEVICE_OPTIONS)
    add_device_options(parser)
    return parser


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse, in one line, values that would only fail (or train nonsense) later."""
    positive = ("drafter_layers", "num_anchors", "batch_size", "max_seq_len", "epochs", "log_every")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.save_every_minutes < 0:
        raise UsageError(f"--save-every-minutes must be 0 (off) or positive, got {cfg.save_every_minutes}")
    if cfg.loss_chunk_size < 0:
        raise UsageError(f"--loss-chunk-size must be 0 (all at once) or positive, got {cfg.loss_chunk_size}")
    if cfg.block_size < 2:
        raise UsageError(f"--block-size must be at least 2, got {cfg.block_size}")
    for name in ("steps", "stop_at", "minutes", "gamma"):
        if getattr(cfg, name) is not None and getattr(cfg, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if not cfg.lr > 0:
        raise UsageError(f"--lr must be positive, got {cfg.lr}")
    if cfg.resume and cfg.force:
        raise UsageError("--resume and --force contradict each other")


def train_from_args(args: argparse.Namespace) -> int:
    """The parsed command line is a TrainConfig: check it, then train."""
    cfg = TrainConfig(**vars(args))
    check_train_config(cfg)
    record = run_training(cfg)
    if "stopped_by" in record:
        print(f"stopped by {record['stopped_by']} at step {record['step']}: checkpoint saved in {cfg.out}; "
              f"to continue, run the same command with --resume", file=sys.stderr)
        return 128 + signal.Signals[record["stopped_by"]].value  # the shell's convention: 130 for Ctrl-C
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when trained, 2 (and one `error:` line) on bad input."""
    return run_cli(build_parser(), train_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
