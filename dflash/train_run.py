"""A training run's setup: what it trains with and where it stands (`TrainingRun`), built and
checked before the first step, resumed exactly with --resume (`build_run`). train.py's loop moves
it.

Kept apart from train.py, whose reader follows the recipe and one step: everything here happens
once, before the loop.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn

from dflash.cli import pick_dtype
from dflash.data import Sequences, cut_note, load_sequences, made_with_thinking, split_heldout
from dflash.drafter import Drafter, DrafterConfig
from dflash.evaluation import held_out
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer, stop_token_ids
from dflash.train_config import (MAY_CHANGE_ON_RESUME, TrainConfig, check_sizes, save_dtype,
                                 starting_drafter)
from dflash.training import (Distributed, LogTally, cosine_with_warmup, freeze, resume,
                             steps_per_epoch, wrap_for_training)


@dataclass
class TrainingRun:
    """What a run trains with and where it stands: built once by `build_run`, moved by the loop."""
    cfg: TrainConfig
    place: Distributed
    target: Qwen3
    model: nn.Module  # the drafter, wrapped for DDP or FSDP2 under torchrun
    drafter_config: DrafterConfig  # `cfg` is the run's options, `config` a model's
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sequences: Sequences  # flat arrays: in memory, or mapped from a packed folder
    slot_weights: torch.Tensor  # (B,): each block slot's weight in the loss
    saved: dict  # what every checkpoint holds beside the states: the configs, the data's hash
    global_batch: int  # sequences per optimizer step
    total_steps: int
    last_step: int  # --stop-at ends this job early
    tally: LogTally  # what the next log line reports
    continuations: list = field(default_factory=list)  # --eval-prompts' (evaluation.py)
    heldout: Sequences | None = None  # --heldout's sequences, never trained on
    step: int = 0
    saved_step: int | None = None  # the newest complete checkpoint's
    elapsed_before: float = 0.0  # seconds trained before this job (a resume)
    began: float = 0.0
    last_save: float = 0.0
    tokens_seen: int = 0

    def elapsed(self) -> float:  # seconds trained: this job's, and those before a resume
        return self.elapsed_before + time.perf_counter() - self.began


class Inputs(NamedTuple):
    """What a run reads, loaded and checked (`load_inputs`) before its folder is touched."""
    target: Qwen3
    tokenizer: object
    drafter: Drafter  # new, or --init-from's
    sequences: Sequences
    heldout: Sequences | None
    continuations: list  # --eval-prompts' (evaluation.py)


def load_inputs(cfg: TrainConfig, place: Distributed) -> Inputs:
    """Load and check the target, the tokenizer, the drafter, the data and the held-out prompts:
    all a run reads but its own folder. Nothing is written, so a run refused here (a bad data
    file, a drafter that does not fit) leaves --out as it was, --force or not."""
    device = place.device
    dtype = pick_dtype(cfg.dtype, device, Path(cfg.target))
    target = Qwen3.from_pretrained(cfg.target, device=device, dtype=dtype)
    target = freeze(target)
    tokenizer = find_tokenizer(Path(cfg.tokenizer or cfg.target), cfg.tokenizer is not None)
    drafter = starting_drafter(cfg, target, tokenizer)
    limit = min(cfg.max_seq_len, target.config.max_position_embeddings)  # no position it lacks
    sequences = load_sequences(Path(cfg.data), limit, target.config.vocab_size,
                               target_config=Path(cfg.target) / "config.json", cut=cfg.cut)
    if sequences.cut and place.main:
        print(cut_note(sequences, limit, cfg.max_seq_len, cfg.cut), file=sys.stderr)
    sequences, heldout = split_heldout(sequences, cfg.heldout)
    check_sizes(cfg, drafter.config, target.config, sequences, device)
    continuations = []
    if cfg.eval_prompts:  # checked before the first step: an evaluation never fails late
        stops = stop_token_ids(Path(cfg.tokenizer or cfg.target), tokenizer)
        continuations = held_out(Path(cfg.eval_prompts), target, drafter, tokenizer,
                                 stop_ids=stops, max_new_tokens=cfg.eval_max_new_tokens,
                                 token_healing=not cfg.no_token_healing, place=place,
                                 thinking=made_with_thinking(Path(cfg.data)))
    return Inputs(target, tokenizer, drafter, sequences, heldout, continuations)


def build_run(cfg: TrainConfig, place: Distributed,
              slot_weights_for: Callable[[int], torch.Tensor],
              inputs: Inputs | None = None) -> TrainingRun:
    """The run, from its `inputs` (default: `load_inputs`): the drafter wrapped for training, the
    optimizer and its schedule; with --resume, the saved run continued exactly (its folder must
    then be the run's own: `training.owned_run_folder`). `slot_weights_for(block_size)`: the
    slot weights of the loss (B,), the recipe's (train.py)."""
    device = place.device
    target, _, drafter, sequences, heldout, continuations = inputs or load_inputs(cfg, place)
    global_batch = cfg.batch_size * place.world * cfg.grad_accum
    saved = {"target_config": asdict(target.config), "train_config": asdict(cfg),
             "drafter_config": drafter.config.to_dict(), "data_sha256": sequences.sha256,
             "global_batch": global_batch, "save_dtype": save_dtype(cfg, target.head_weight.dtype)}
    drafter.recompute_layers = not cfg.keep_activations
    model = wrap_for_training(drafter.to(device).train(), place, cfg.fsdp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    total_steps = cfg.steps or cfg.epochs * steps_per_epoch(len(sequences.starts), global_batch)
    schedule = functools.partial(cosine_with_warmup, total_steps=total_steps, warmup=cfg.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)  # each step: schedule(step)
    block_size = drafter.config.block_size
    run = TrainingRun(cfg, place, target, model, drafter.config, optimizer, scheduler, sequences,
                      slot_weights_for(block_size), saved, global_batch, total_steps,
                      min(total_steps, cfg.stop_at or total_steps),
                      LogTally.zeros(block_size, device), continuations=continuations,
                      heldout=heldout)
    if cfg.resume:
        run.step, run.elapsed_before = resume(Path(cfg.out), saved, model, optimizer, scheduler,
                                              place, may_change=MAY_CHANGE_ON_RESUME)
        run.saved_step = run.step
    run.began = run.last_save = time.perf_counter()
    return run
