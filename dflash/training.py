"""What a training loop needs around its recipe, written once.

`train.py` trains a DFlash drafter and `recipes/tiny/train_target.py` the demo target;
what they share has nothing to do with DFlash:

1. **Placement.** A run is one process, or one of several under `torchrun` (gloo on
   CPU, nccl on CUDA, one GPU per process). `Distributed` says where this process sits
   and pools numbers across all of them; `distributed_run` joins the job for the
   length of a run and leaves it together; `epoch_order` deals each epoch out among them.
2. **Replicas and shards.** DDP replicates the model, FSDP2 shards it. `full_state`
   and `load_full_state` turn either into plain state dicts and back, so a checkpoint
   is the same file however many processes wrote it.
3. **An exact resume.** A run folder that is never mixed up with another run, the
   random states (`rng_states`), and a training state written atomically and read
   back safely: tensors and plain containers, never pickled code; and a run that
   stops on Ctrl-C or SIGTERM (`stop_on_signals`) finishes its step and saves first.
4. **The loop's small parts**: one optimiser step, the schedule (linear warm-up,
   then cosine down to zero), `every` for what is due every so many steps.
5. **Options from a config dataclass**: one command-line option per field, its help
   kept in the field, so that no option is written out twice.

Nothing here imports a model or a script: every program may stand on it.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
import types
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from dflash.checkpoint import write_atomically
from dflash.cli import UsageError, int_list, pick_device

# ------------------------------------------------------------------------ placement


@dataclass
class Distributed:
    """Where this process sits in a torchrun job (rank 0 of 1 when run plainly)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        """The process that writes files and prints."""
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor summed over all processes, in place."""
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor

    def any_of(self, *flags: bool) -> list[bool]:
        """For each flag, True on every process if it is True on one (e.g. one ran out of time): one collective call."""
        pooled = self.sum(torch.tensor([float(flag) for flag in flags], device=self.device))
        return [bool(value) for value in pooled.tolist()]

    def gather(self, value) -> list:
        """Every process's `value`, in rank order."""
        if self.world == 1:
            return [value]
        values = [None] * self.world
        dist.all_gather_object(values, value)
        return values


def setup_distributed(device_name: str) -> Distributed:
    """Join the torchrun job if there is one: gloo on CPU, nccl on CUDA, one GPU per process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(device_name)
    if world == 1:
        return Distributed(device=device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Distributed(dist.get_rank(), world, device)


@contextmanager
def distributed_run(device_name: str) -> Iterator[Distributed]:
    """This process's place for the length of a run; the job's processes leave it together.

    A run that ends well ends with a barrier, so that no process leaves the group while
    the main one still writes the last checkpoint; the group is left even on failure.
    """
    place = setup_distributed(device_name)
    try:
        yield place
        if place.world > 1:
            dist.barrier()
    finally:
        if place.world > 1:
            dist.destroy_process_group()


def epoch_order(num_items: int, epoch: int, seed: int, rank: int, world: int) -> list[int]:
    """This process's share of one epoch's shuffled order (as DistributedSampler: pad by wrapping, then stride)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(num_items, generator=generator).tolist()
    order += order[: (-len(order)) % world]  # every process gets the same number of items
    return order[rank::world]


# ----------------------------------------------------------------- replicas and shards


def wrap_for_training(model: nn.Module, place: Distributed, fsdp: bool) -> nn.Module:
    """Replicate (DDP) or shard (FSDP2: each of `model.layers`, then the rest) the model; alone, use it as is."""
    if place.world == 1:
        return model
    if fsdp:
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            raise UsageError("--fsdp needs torch.distributed.fsdp.fully_shard (PyTorch >= 2.6)") from None
        for layer in model.layers:
            fully_shard(layer)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[place.device.index] if place.device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards it in place: nothing to unwrap)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> tuple[dict, dict]:
    """Plain (unsharded, CPU) state dicts of the model and optimizer; with FSDP a collective call."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)
    weights = {name: tensor.detach().cpu() for name, tensor in unwrap(model).state_dict().items()}
    return weights, optimizer.state_dict()


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optim: dict,
                    fsdp: bool) -> None:
    """The inverse of `full_state`: every process loads the full states (FSDP keeps its shard)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, weights, options=options)
        set_optimizer_state_dict(model, optimizer, optim, options=options)
        return
    unwrap(model).load_state_dict(weights)
    optimizer.load_state_dict(optim)


# ---------------------------------------------------------------------- an exact resume


def rng_states(**generators: torch.Generator) -> dict:
    """torch's global random states and the named generators', as tensors (loadable with weights_only=True)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            **{name: generator.get_state() for name, generator in generators.items()}}


def restore_rng_states(states: dict, **generators: torch.Generator) -> None:
    """The inverse of `rng_states` (a checkpoint of an older version may hold more states: unused)."""
    torch.set_rng_state(states["torch"])
    if states["cuda"]:
        torch.cuda.set_rng_state_all(states["cuda"])
    for name, generator in generators.items():
        generator.set_state(states[name])


def prepare_run_folder(out: Path, resume: bool, force: bool, outputs: tuple[str, ...]) -> None:
    """Refuse to mix a new run into an old one by accident; with --force, remove the old run's `outputs`."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not (resume or force):
        raise UsageError(f"{out}: exists and is not empty (use --resume to continue or --force to overwrite)")
    if force and not resume:
        for name in outputs:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def save_training_state(path: Path, state: dict) -> None:
    """Write what a resume needs, atomically: a crash mid-write leaves the previous state whole."""
    write_atomically(path, lambda tmp: torch.save(state, tmp))


def load_training_state(path: Path) -> dict:
    """Read a training state back safely: `weights_only` unpickles tensors and plain containers, never code."""
    if not path.is_file():
        raise UsageError(f"{path}: nothing to resume (no training state)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: torch raises several error types
        raise UsageError(f"{path}: not a readable training state ({type(err).__name__})") from None


# ---------------------------------------------------------------- stopping on a signal


class StopRequest:
    """Set when Ctrl-C (SIGINT) or a scheduler's SIGTERM arrives: the loop finishes its step, saves, exits.

    The handler only records the signal, so a checkpoint being written is never cut
    in half. A second signal of the same kind acts at once, as if no handler were
    installed (Ctrl-C twice: a KeyboardInterrupt).
    """

    def __init__(self):
        self.signal: int | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    def handle(self, signum, frame) -> None:
        self.signal = signum
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Catch SIGINT and SIGTERM for the length of the block; the previous handlers come back after it."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield request
        return
    previous = {signum: signal.signal(signum, request.handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# --------------------------------------------------------------------- the loop's parts


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
    """Backward, clip the gradient norm, update, and clear the gradients for the next step."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()


def cosine_with_warmup(total_steps: int, warmup: float) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warm-up over `warmup` of the steps, then cosine down to 0."""
    warmup_steps = max(1, round(warmup * total_steps))

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return multiplier


def every(step: int, period: int) -> bool:
    """Is `step` one of every `period` steps? Never when the period is 0 (off)."""
    return period > 0 and step % period == 0


# ------------------------------------------------------------- options from a config


def option(default, help: str, **argparse_options):
    """A config field: its default, plus the help (and argparse extras) of its command-line option."""
    return field(default=default, metadata={"help": help, **argparse_options})


def add_config_options(parser: argparse.ArgumentParser, config_class: type, skip: tuple[str, ...] = ()) -> None:
    """One option per field of a config dataclass: `--field-name`, with the field's type, default and help.

    A `bool` field is a switch; the parsed namespace is then `config_class(**vars(args))`.
    """
    hints = typing.get_type_hints(config_class)
    for spec in fields(config_class):
        if spec.name in skip:
            continue
        flag, text = "--" + spec.name.replace("_", "-"), spec.metadata["help"]
        if hints[spec.name] is bool:
            parser.add_argument(flag, action="store_true", help=text)
            continue
        if spec.default not in (None, ""):
            text += f" (default: {spec.default})"
        parser.add_argument(flag, type=option_type(hints[spec.name]), default=spec.default, help=text,
                            required=spec.metadata.get("required", False))


def option_type(hint) -> Callable[[str], object]:
    """How a field's option reads its value: `int | None` as an int, `list[int]` as 1,2,3."""
    if isinstance(hint, types.UnionType):  # X | None: optional, read as X
        hint = next(kind for kind in typing.get_args(hint) if kind is not type(None))
    return int_list if hint == list[int] else hint
