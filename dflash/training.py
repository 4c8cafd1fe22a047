"""What a training loop needs around its recipe (train.py's blocks, labels and loss), for
`train.py` and the demo target's trainer; it imports no model. It holds:

- a process's place in a torchrun job (`Distributed`);
- a step's batch: which sequences, each process's share cut into micro-batches, and the anchors
  in them, all fixed by (seed, step) and never by how processes share the step (`micro_batches`);
- the model around training: initialisation, DDP or FSDP2, gradient sync and clipping, the
  learning rate's schedule;
- the run's folder and checkpoints: a lock, exact resume, atomic writes (Ctrl-C saves first);
- what a step ends with (`what_is_due`) and the log (`LogTally`, `write_log`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from dflash.checkpoint import (SIDE_FILE_LIMIT, check_regular_file, read_jsonl, read_text,
                               remove_partial_writes, save_tensors, write_atomically)
from dflash.cli import UsageError, check_output, pick_device
from dflash.kept_checkpoints import (BEST, CHECKPOINTS, best_loss, keep_best, keep_last,
                                     remove_unfinished, training_states)

STATE_FILE, LOG_FILE = "training_state.pt", "train_log.jsonl"  # in a run's folder, beside the drafter it trains
LOCK_FILE = "train.lock"  # while a run owns its folder: "host pid"
CHECKPOINT_FILES = (STATE_FILE, "model.safetensors", "config.json")  # one checkpoint, whole
RUN_OUTPUTS = (LOG_FILE, *CHECKPOINT_FILES, CHECKPOINTS, BEST)  # what --force removes


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
        """Each flag, True everywhere if it is True on one process (one ran out of time): one collective call."""
        pooled = self.sum(torch.tensor([float(bool(flag)) for flag in flags], device=self.device))
        return [bool(value) for value in pooled.tolist()]


@contextmanager
def distributed_run(device_name: str) -> Iterator[Distributed]:
    """Join the torchrun job if there is one (gloo on CPU, nccl on CUDA, one GPU a process). A run that ends
    well ends at a barrier, so no process leaves while the main one still writes; the group is left anyway."""
    world, device = int(os.environ.get("WORLD_SIZE", "1")), pick_device(device_name)
    if world == 1:
        yield Distributed(device=device)
        return
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield Distributed(dist.get_rank(), world, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ------------------------------------------------ a step's batch: drawn, shared out, anchored


class MicroBatch(NamedTuple):
    """Sequences and the blocks drawn in them: what one forward of the drafter trains on."""
    input_ids: torch.Tensor  # (batch, S)
    loss_mask: torch.Tensor  # (batch, S): 1 on the answer's tokens
    anchors: torch.Tensor  # (batch, K): where each block starts
    real: torch.Tensor  # (batch, K): False for the padding blocks of rows with fewer anchors


def micro_batches(data, step: int, global_batch: int, cfg, place: Distributed) -> list[MicroBatch]:
    """This process's micro-batches of `step`, anchored (`cfg`: the run's TrainConfig). Which
    sequences, and where their blocks start, depend on the global batch (size, seed, step), not on
    how processes share it out."""
    epoch, items = global_batch_items(len(data.starts), global_batch, step, cfg.seed)
    return [micro_batch(data, indices, epoch, cfg, place.device)
            for indices in share_of_batch(items, place, cfg.grad_accum)]


def steps_per_epoch(num_items: int, global_batch: int) -> int:
    """Steps to see every item once, `global_batch` items a step (the last step of an epoch filled
    from its start)."""
    return math.ceil(num_items / global_batch)


def global_batch_items(num_items: int, global_batch: int, step: int,
                       seed: int) -> tuple[int, list[int]]:
    """(epoch, the items of `step`): each epoch shuffled anew and cut into global batches, the last
    one filled by wrapping to the epoch's start. Only the global batch's size decides them, not how
    processes share it."""
    epoch, index = divmod(step, steps_per_epoch(num_items, global_batch))
    shuffle = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(num_items, generator=shuffle).tolist()
    return epoch, [order[position % num_items]
                   for position in range(index * global_batch, (index + 1) * global_batch)]


def share_of_batch(items: list[int], place: Distributed, micro_batches: int) -> list[list[int]]:
    """This process's part of a global batch, every `world`-th item as DistributedSampler strides,
    cut into `micro_batches` equal micro-batches (the global batch is processes x micro-batches x
    the batch size)."""
    mine = items[place.rank::place.world]
    size = len(mine) // micro_batches
    return [mine[number * size:(number + 1) * size] for number in range(micro_batches)]


def micro_batch(data, indices: list[int], epoch: int, cfg, device) -> MicroBatch:
    """Sequences `indices` of `data` (a `Sequences`), with their anchors of `epoch`."""
    rows = [slice(data.starts[i], data.starts[i] + data.lengths[i]) for i in indices]
    sequences = [(data.tokens[row], data.loss_mask[row]) for row in rows]  # read from disk here
    for i, (ids, mask) in zip(indices, sequences):  # a file changed since it was checked
        if data.vocab_size is not None:
            check_batch(ids, mask, data.vocab_size, f"{data.source}: sequence {i}")
    input_ids, loss_mask = collate(sequences, device)  # (batch, S)
    generators = [anchor_generator(cfg.seed, epoch, i) for i in indices]
    anchors, real = batch_anchors(loss_mask, cfg.num_anchors, generators)  # (batch, K) each
    return MicroBatch(input_ids, loss_mask, anchors, real)


def check_batch(ids: np.ndarray, mask: np.ndarray, vocab_size: int, where: str) -> None:
    """Refuse token ids past the vocabulary and mask values other than 0 and 1 (one max each):
    the embedding would fail on the one, RoPE on the other, far from the file that is wrong."""
    if len(ids) and int(ids.max()) >= vocab_size:
        raise UsageError(f"{where}: token id {int(ids.max())} is outside the target's vocabulary "
                         f"(0..{vocab_size - 1})")
    if len(mask) and int(mask.max()) > 1:
        raise UsageError(f"{where}: loss mask value {int(mask.max())}, not 0 or 1")


def collate(sequences: list[tuple], device) -> tuple[torch.Tensor, ...]:
    """(input_ids, loss_mask) pairs, lists or arrays, right-padded to the longest: (batch, S) ids
    and loss mask; the padding's mask 0 keeps it out."""
    ids, masks = zip(*sequences)
    return tuple(pad_sequence([torch.tensor(np.asarray(row, dtype=np.int64)) for row in rows],
                              batch_first=True).to(device) for rows in (ids, masks))  # (batch, S)


def anchor_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """What draws sequence `index`'s anchors in `epoch`: the same whichever process, micro-batch or
    row the sequence lands in, so how a step is shared out never changes what it computes."""
    mixed = np.random.SeedSequence([seed % 2**64, epoch, index])  # mixes all three
    return torch.Generator().manual_seed(int(mixed.generate_state(1, np.uint64)[0]))


def batch_anchors(loss_mask: torch.Tensor, num_anchors: int, generators: Sequence[torch.Generator]):
    """Row i's anchors, drawn by `generators[i]`, padded: (batch, K) positions and is-real."""
    per_row = [sample_anchors(row.cpu(), num_anchors, generator)
               for row, generator in zip(loss_mask, generators, strict=True)]
    anchors = pad_sequence(per_row, batch_first=True)  # (batch, K); padding blocks sit at 0
    real = pad_sequence([torch.ones(len(a), dtype=torch.bool) for a in per_row], batch_first=True)
    return anchors.to(loss_mask.device), real.to(loss_mask.device)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int,
                   generator: torch.Generator) -> torch.Tensor:
    """Up to `num_anchors` distinct valid anchors, uniformly without replacement, sorted."""
    valid = valid_anchor_positions(loss_mask)
    picks = torch.randperm(len(valid), generator=generator)[:num_anchors]
    return valid[picks.to(valid.device)].sort().values


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Where inference drafts a block: x_a and x_{a+1} in the answer (the prefill yields x_a)."""
    answer = loss_mask == 1
    return (answer[:-1] & answer[1:]).nonzero()[:, 0]  # (n,): a such that a + 1 < S


def heldout_batches(data, cfg, place: Distributed) -> list[MicroBatch]:
    """This process's batches of the held-out split, anchored alike at every evaluation (epoch 0).
    As many on every process (FSDP2 gathers the weights in each forward): one with no sequence
    left is a stand-in whose blocks are all padding, so it counts nothing."""
    batches = []
    for share in heldout_shares(len(data.starts), cfg.batch_size, place):
        batch = micro_batch(data, share or [0], 0, cfg, place.device)
        batches.append(batch if share else batch._replace(real=torch.zeros_like(batch.real)))
    return batches


def heldout_shares(count: int, batch_size: int, place: Distributed) -> list[list[int]]:
    """This process's batches of the `count` held-out items, every `world`-th: as many batches on
    every process, an empty one where it has no item left."""
    mine = list(range(place.rank, count, place.world))
    batches = math.ceil(math.ceil(count / place.world) / batch_size)
    return [mine[number * batch_size:(number + 1) * batch_size] for number in range(batches)]


# ------------------------------------------------ the model around training: DDP or FSDP2, gradients


def wrap_for_training(model: nn.Module, place: Distributed, fsdp: bool) -> nn.Module:
    """Replicate (DDP) or shard (FSDP2: each of `model.layers`, then the rest) the model; alone, use it as is."""
    if place.world == 1:
        return model
    if not fsdp:
        device_ids = [place.device.index] if place.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise UsageError("--fsdp needs torch.distributed.fsdp.fully_shard (PyTorch >= 2.6)") from None
    for layer in model.layers:
        fully_shard(layer)
    return fully_shard(model)


def init_weights(model: nn.Module, seed: int | None = None) -> nn.Module:
    """Qwen3's initialisation in place (no second copy of a large model): weights ~ N(0, 0.02), norms 1, drawn with
    `seed` (None: from torch's global RNG). The parameters must be on the CPU, where the generator is."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0) if name.endswith("norm.weight") else parameter.normal_(0.0, 0.02, generator=generator)
    return model


def freeze(model: nn.Module) -> nn.Module:
    """A model that never trains (the drafter's target, its embedding and LM head included)."""
    return model.requires_grad_(False).eval()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards it in place: nothing to unwrap)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, DDP all-reduces the gradients only if `enabled`: the micro-batches before a step's last
    accumulate theirs in place, the last one's backward reduces their sum once. FSDP2 reduce-scatters every
    micro-batch: each process then only ever holds its shard of the gradient, the memory FSDP is chosen for."""
    if enabled or not isinstance(model, nn.parallel.DistributedDataParallel):
        yield
    else:
        with model.no_sync():
            yield


def apply_gradients(model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """Clip the gradient's norm, update, and clear the gradients for the next step; the norm before clipping."""
    norm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2's is a DTensor


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
    """Backward, then `apply_gradients`: one batch, one step."""
    loss.backward()
    apply_gradients(model, optimizer, grad_clip)


def cosine_with_warmup(step: int, total_steps: int, warmup: float) -> float:
    """The learning rate's multiplier at `step`: linear warm-up over `warmup` of the steps, then cosine down to 0."""
    warmup_steps = max(1, round(warmup * total_steps))
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ------------------------------------------------ the run's folder: checkpoints, exact resume, the lock


def snapshot(model: nn.Module, optimizer, scheduler, place: Distributed, fsdp: bool) -> dict:
    """All a resume needs as plain (unsharded, CPU) tensors and containers, the same however many processes
    wrote it: weights, optimizer, schedule, and every process's random states. A collective call."""
    if fsdp:
        from torch.distributed.checkpoint import state_dict as dcp
        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = dcp.get_model_state_dict(model, options=options)
        optimizer_state = dcp.get_optimizer_state_dict(model, optimizer, options=options)
    else:
        model_state = {name: tensor.detach().cpu() for name, tensor in unwrap(model).state_dict().items()}
        optimizer_state = optimizer.state_dict()
    rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    rngs = [rng] * place.world  # every process's, in rank order
    if place.world > 1:
        dist.all_gather_object(rngs, rng)
    return {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rngs}


def full_state_dict(model: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The model's whole state dict on every process, FSDP2's shards gathered (a collective call)."""
    if not fsdp:
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint import state_dict as dcp
    return dcp.get_model_state_dict(model, options=dcp.StateDictOptions(full_state_dict=True))


def restore_snapshot(state: dict, model: nn.Module, optimizer, scheduler, place: Distributed, fsdp: bool) -> None:
    """The inverse of `snapshot`: every process loads the full states (FSDP keeps its shard) and its
    own random state, or the first process's when the run had fewer: nothing a step computes draws
    from it (data order and anchors have their own generators), so any number of processes may
    resume a run."""
    if fsdp:
        from torch.distributed.checkpoint import state_dict as dcp
        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_model_state_dict(model, state["model"], options=options)
        dcp.set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    else:
        unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng = state["rng"][place.rank if place.rank < len(state["rng"]) else 0]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(out: Path, model: nn.Module, optimizer, scheduler, place: Distributed,
                    run: dict, *, previous: int | None = None) -> None:
    """Into `out`: all a resume needs (`run`: the configs, the step, the time) and the trained model
    (`config.json` + `model.safetensors` in `run["save_dtype"]`, as `from_pretrained` reads them;
    the training state keeps float32), each file written
    atomically, the training state first: it holds the weights too, so a crash or a full disk
    between the writes never pairs two steps' states. A write that fails is one line saying what
    is still whole (`previous`: the step of the last complete checkpoint). A collective call; the
    main process writes."""
    state = snapshot(model, optimizer, scheduler, place, run["train_config"]["fsdp"])
    if not place.main:
        return
    step = run["step"]
    kept = "no checkpoint yet" if previous is None else f"step {previous}'s checkpoint, complete"
    try:
        save_training_state(out / STATE_FILE, {**state, **run})
    except (OSError, RuntimeError) as err:  # a full disk: torch's writer raises RuntimeError
        raise UsageError(f"saving step {step} failed ({failure(err)}): {out} keeps {kept}; free "
                         f"some space, then run the same command with --resume") from None
    try:
        dtype = getattr(torch, run.get("save_dtype", "float32"))  # as served: bf16, say
        served = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor
                  for name, tensor in state["model"].items()}
        save_tensors(out, served, run["drafter_config"])
    except OSError as err:
        raise UsageError(f"saving step {step}'s drafter failed ({failure(err)}): its training "
                         f"state is complete; free some space, then run the same command with "
                         f"--resume (model.safetensors is written again)") from None
    try:
        keep_last(out, step, run["train_config"].get("keep", 1), CHECKPOINT_FILES)
    except OSError as err:
        raise UsageError(f"keeping step {step}'s checkpoint in {out / CHECKPOINTS} failed "
                         f"({failure(err)}): {out} holds it, complete") from None


def keep_if_best(out: Path, loss: float, step: int, place: Distributed,
                 save: Callable[[], None]) -> bool:
    """Keep step `step`'s checkpoint in best/ if its held-out `loss` is the lowest yet, after
    `save` has made sure there is one of this step. A collective call: every process agrees (the
    main one reads best/), and saves with the others."""
    lowest = best_loss(out) if place.main else None
    best, = place.any_of(place.main and (lowest is None or loss < lowest))
    if best:
        save()
        if place.main:
            keep_best(out, step, loss, CHECKPOINT_FILES)
    return best


def failure(err: Exception) -> str:
    """What an I/O error says, in one line: the system's reason, where torch's writer wraps it."""
    cause = err
    while cause is not None and not (isinstance(cause, OSError) and cause.strerror):
        cause = cause.__context__
    return cause.strerror if cause is not None else str(err).splitlines()[0]


def newest_training_state(out: Path, say: bool = True) -> tuple[Path, dict]:
    """The newest training state that reads whole, and where: `out`'s own, else (one that cannot
    be read is passed over, with a note when `say`) the newest kept in checkpoints/."""
    paths = training_states(out, STATE_FILE) or [out / STATE_FILE]  # none: the error names it
    for path in paths[:-1]:
        try:
            return path, load_training_state(path)
        except UsageError as err:
            if say:
                print(f"note: {err}: resuming from an older checkpoint", file=sys.stderr)
    return paths[-1], load_training_state(paths[-1])


def resume(out: Path, run: dict, model: nn.Module, optimizer, scheduler, place: Distributed, *,
           may_change: tuple[str, ...]) -> tuple[int, float]:
    """Continue the run saved in `out` exactly, from its training state: (step, seconds trained). The target, the
    options but `may_change`, and the drafter (a default or the tokenizer may change it) must be the saved ones."""
    state_path, state = newest_training_state(out, place.main)
    stop_at = run["train_config"].get("stop_at")
    if stop_at is not None and stop_at < state["step"]:
        raise UsageError(f"--stop-at {stop_at}: the run in {out} is already at step {state['step']}")
    refuse_changes(state["target_config"], run["target_config"], f"{state_path}: trained for another target:")
    refuse_changes(state["train_config"], run["train_config"], "--resume: the option", may_change)
    refuse_changes(state["drafter_config"], run["drafter_config"], "--resume: the drafter's")
    if state.get("global_batch", run["global_batch"]) != run["global_batch"]:
        raise UsageError(f"--resume: the run trained on {state['global_batch']} sequences a step, "
                         f"this one would on {run['global_batch']} (processes x --batch-size x "
                         f"--grad-accum: keep the product the same)")
    if state.get("data_sha256", run["data_sha256"]) != run["data_sha256"]:  # older runs saved none
        raise UsageError(f"--resume: the data file's contents changed since the run began "
                         f"(sha256 {state['data_sha256'][:12]}..., now "
                         f"{run['data_sha256'][:12]}...): resume with the data it started with")
    restore_snapshot(state, model, optimizer, scheduler, place, run["train_config"]["fsdp"])
    if place.main:
        forget_log_after(out / LOG_FILE, state["step"])  # its steps after the state are about to be redone
    return state["step"], state["elapsed"]


@contextmanager
def owned_run_folder(out: Path, resume: bool, force: bool, outputs: tuple[str, ...],
                     main: bool = True) -> Iterator[None]:
    """`prepare_run_folder`, then, within the block, the run owns `out`: the main process holds
    its lock file, taken before anything in the folder is judged or removed and released on exit
    (a crashed run's is noticed by its process id), so a second run into it is refused. Enter it
    only once every input is loaded and checked: --force removes the old run's files here."""
    if not main:
        yield
        return
    check_output(out, "--out", folder=True)
    found_lock = (out / LOCK_FILE).exists()  # a run of train.py was here: the folder is a run's
    if not resume:  # a new run's folder is made now, so that its lock comes first there too
        out.mkdir(parents=True, exist_ok=True)
    locked = out.is_dir() and take_lock(out / LOCK_FILE)  # not there: nothing to resume, refused
    try:
        prepare_run_folder(out, resume, force, outputs, found_lock)
        yield
    finally:
        if locked:
            (out / LOCK_FILE).unlink(missing_ok=True)


def prepare_run_folder(out: Path, resume: bool, force: bool, outputs: tuple[str, ...],
                       found_lock: bool = False) -> None:
    """Refuse to mix a new run into an old one by accident, or to resume what is not there; with
    --force, remove the old run's `outputs`, from a run folder only (`check_run_folder`). What a
    kill during a save left of them (`write_atomically`'s temporary files, a kept checkpoint's
    `.partial` folder) goes."""
    check_output(out, "--out", folder=True)
    if resume and not out.is_dir():
        raise UsageError(f"{out}: nothing to resume (no such folder)")
    in_use = out.exists() and any(path.name != LOCK_FILE for path in out.iterdir())
    if in_use and not (resume or force):
        raise UsageError(f"{out}: exists and is not empty (use --resume to continue or --force to "
                         f"overwrite)")
    if in_use and force and not resume:
        check_run_folder(out, outputs, found_lock)
        for name in outputs:
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink(missing_ok=True)
    check_regular_file(out / LOG_FILE, UsageError, "training log")  # appended to: a FIFO hangs
    out.mkdir(parents=True, exist_ok=True)
    remove_partial_writes(out, outputs)
    remove_unfinished(out)


def check_run_folder(out: Path, outputs: tuple[str, ...], found_lock: bool) -> None:
    """Refuse to empty a folder that does not carry train.py's mark: a lock or a training state,
    or nothing but what train.py writes. --force pointed at a checkpoint or a user's folder by
    mistake would otherwise delete its weights."""
    if found_lock or (out / STATE_FILE).is_file():
        return
    ours = {*outputs, LOCK_FILE, f"{BEST}.partial", f"{BEST}.old"}
    foreign = sorted(path.name for path in out.iterdir() if not (
        path.name in ours or path.suffix == ".tmp" and path.name.startswith(outputs)))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UsageError(f"{out}: holds {foreign[0]}{more}, not a run folder of train.py (no "
                         f"{STATE_FILE} or {LOCK_FILE}): --force empties only a run folder; name "
                         f"another --out")


def take_lock(lock: Path) -> bool:
    """Create `lock` holding "host pid" (True), or refuse in one line if a live run holds it. A
    lock whose process is gone on this host is a crashed run's (as is an empty one: a crash
    between its creation and its line): it is replaced. One that says something else is not
    guessed at."""
    for _ in range(2):
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            host, pid = lock_holder(lock)
            if host is not None and (host != socket.gethostname() or process_alive(pid)):
                raise UsageError(f"{lock.parent}: another run is training in it (process {pid} "
                                 f"on {host}, {lock.name}); wait for it, or use another --out") \
                    from None
            lock.unlink(missing_ok=True)  # its run crashed
            continue
        with os.fdopen(handle, "w") as file:
            file.write(f"{socket.gethostname()} {os.getpid()}\n")
        return True
    raise UsageError(f"{lock}: could not take the lock (another run is starting?)")


def lock_holder(lock: Path) -> tuple[str | None, int]:
    """(host, process id) a lock file names, or (None, 0) for an empty one; anything else (not a
    regular file, not UTF-8, not "host pid") is refused in one line."""
    text = read_text(lock, UsageError, "lock file", limit=SIDE_FILE_LIMIT).strip()
    host, _, pid = text.partition(" ")
    if not text:
        return None, 0
    if not (host and pid.isdigit() and pid.isascii()):
        raise UsageError(f"{lock}: not a lock of train.py (expected \"host pid\", got "
                         f"{text[:40]!r}); remove it if no run trains in {lock.parent}")
    return host, int(pid)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def save_training_state(path: Path, state: dict) -> None:
    """Write what a resume needs, atomically: a crash mid-write leaves the previous state whole."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as file:  # a Python file: a full disk's error keeps its reason
            torch.save(state, file)

    write_atomically(path, write)


def load_training_state(path: Path) -> dict:
    """Read a training state back safely: `weights_only` unpickles tensors and plain containers, never code."""
    if not path.is_file():
        raise UsageError(f"{path}: nothing to resume (no training state)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: torch raises several error types
        raise UsageError(f"{path}: not a readable training state ({type(err).__name__})") from None


def refuse_changes(saved: dict, now: dict, what: str, may_change: tuple[str, ...] = ()) -> None:
    """A resume continues the same run: each setting not in `may_change` must be the one the run saved."""
    for name, value in now.items():
        if name not in may_change and saved.get(name) != value:
            raise UsageError(f"{what} {name} was {saved.get(name)!r}, now {value!r} (keep it the same)")


def forget_log_after(log: Path, step: int) -> None:
    """Drop a JSONL log's lines of steps after the checkpoint a resume starts from: they are about to be redone.
    A last line without its newline is what a kill during an append leaves: it goes too. Read as a side file
    (a regular file of bounded size, UTF-8); a line that is not the log's is refused, naming it."""
    if log.exists():
        records = read_jsonl(log, "training log", UsageError, whole_lines_only=True, limit=SIDE_FILE_LIMIT)
        kept = [json.dumps(record) for where, record in records if logged_step(record, where) <= step]
        write_atomically(log, lambda tmp: Path(tmp).write_text("".join(line + "\n" for line in kept)))


def logged_step(record, where: str) -> int:
    """The step a training log record is about."""
    step = record.get("step") if isinstance(record, dict) else None
    if type(step) is not int:  # a `true` is no step
        raise UsageError(f"{where}: no integer 'step' (not a line of train.py's log)")
    return step


# ------------------------------------------------ what a step ends with, and the log


class Signals:
    """Within the block, Ctrl-C or SIGTERM only sets `.name` ("SIGINT"): the loop ends its step and
    saves, so a checkpoint is never cut in half. A second one acts at once (Ctrl-C raises
    KeyboardInterrupt), but waits for the end of a save (`deferred`), and not under torchrun: it
    passes on the signal its process group already got (and kills its processes itself if they are
    slow to end). The previous handlers come back after."""

    def __init__(self):
        self.name, self.pending, self.deferring = "", None, False
        self.second_acts = "LOCAL_RANK" not in os.environ  # torchrun sets it
        self.previous = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():  # signals reach it only
            self.previous = {signum: signal.signal(signum, self.handle)
                             for signum in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exception) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def handle(self, signum, frame) -> None:
        first = not self.name
        self.name = self.name or signal.Signals(signum).name
        if not first and self.second_acts:
            self.pending = signum
            if not self.deferring:
                self.act()

    def act(self) -> None:
        """The second signal's effect: Ctrl-C's KeyboardInterrupt, or SIGTERM's end."""
        signum, self.pending = self.pending, None
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A second signal within the block acts only after it: what it writes is written whole."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending is not None:
            self.act()


class Due(NamedTuple):
    """What a step ends with."""
    stop: bool
    signaled: bool  # stopped by a signal (this process's or another's)
    save: bool
    log: bool
    evaluate: bool


def what_is_due(run, signals: Signals, loss: torch.Tensor, gradient_norm: torch.Tensor) -> Due:
    """What `train.py`'s `run` ends its step with, agreed by every process in one collective call:
    a signal, the clock or the last step stops the run, which then saves; a loss that is not
    finite stops it before anything is saved, so the last checkpoint stays the last good one."""
    cfg, step, now = run.cfg, run.step, time.perf_counter()
    signaled, out_of_time, save_by_clock, diverged = run.place.any_of(
        signals.name, cfg.minutes is not None and now - run.began > 60 * cfg.minutes,
        0 < cfg.save_every_minutes and now - run.last_save >= 60 * cfg.save_every_minutes,
        not (torch.isfinite(loss) & torch.isfinite(gradient_norm)))
    if diverged:
        raise UsageError(f"step {step}: the loss or its gradient is not finite (loss "
                         f"{loss.item():g}, gradient norm {gradient_norm.item():g}); stopped "
                         f"without saving (try a lower --lr)")
    stop = step >= run.last_step or out_of_time or signaled
    evaluating = bool(cfg.eval_prompts or cfg.heldout) and not signaled and (
        step == run.total_steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0))
    save = stop or save_by_clock or (cfg.save_every > 0 and step % cfg.save_every == 0)
    return Due(stop, signaled, save, step % cfg.log_every == 0 or stop or evaluating, evaluating)


def estimated_tau(correct: torch.Tensor, counted: torch.Tensor) -> float:
    """A cheap stand-in for tau, 1 + sum_k prod_{i<=k} acc_i over slots 1..B-1: a trend, not a tau, since it treats
    hits as independent and real blocks start right after a miss (tutorial 04, section 7, measures the gap)."""
    accuracy = correct[1:] / counted[1:].clamp(min=1)
    return 1.0 + torch.cumprod(accuracy, dim=0).sum().item()


@dataclass
class LogTally:
    """What the next log line reports, summed over the steps since the last one."""

    loss: torch.Tensor  # (): each step's loss; a process holds its share, the shares add up to the step's mean
    correct: torch.Tensor  # (B,): block slots guessed right, per slot
    counted: torch.Tensor  # (B,): block slots labelled, per slot
    grad_norm: torch.Tensor  # (): the gradient's norm before clipping, the same in every process
    steps: int = 0

    @classmethod
    def zeros(cls, block_size: int, device: torch.device) -> LogTally:
        return cls(*(torch.zeros(size, device=device) for size in ((), (block_size,), (block_size,), ())))

    def add(self, loss: torch.Tensor, correct: torch.Tensor, counted: torch.Tensor) -> None:
        """One micro-batch's loss and per-slot counts."""
        self.loss += loss.detach()
        self.correct += correct
        self.counted += counted

    def end_step(self, grad_norm: torch.Tensor) -> None:
        self.grad_norm += grad_norm.detach()
        self.steps += 1

    def pooled(self, place: Distributed) -> dict:
        """The log line's figures, pooled over the processes and averaged over the steps; then start over.
        A collective call."""
        block_size = len(self.correct)
        summed = place.sum(torch.cat([self.loss[None], self.correct, self.counted]))  # (1 + 2B,): one call
        loss, correct, counted = summed[0], summed[1:1 + block_size], summed[1 + block_size:]
        accuracy = (correct[1:] / counted[1:].clamp(min=1)).tolist()  # slots 1..B-1
        record = {"loss": loss.item() / self.steps, "grad_norm": self.grad_norm.item() / self.steps,
                  "slot_accuracy": [round(a, 4) for a in accuracy],
                  "tau_estimate": round(estimated_tau(correct, counted), 4)}
        for tensor in (self.loss, self.correct, self.counted, self.grad_norm):
            tensor.zero_()
        self.steps = 0
        return record


def write_log(log_path: Path, record: dict, bar, tokens_per_second: float) -> None:
    """Append the record to the JSONL log and show its main figures on the progress bar."""
    try:
        with open(log_path, "a") as log:
            log.write(json.dumps(record) + "\n")
    except FileNotFoundError:
        raise UsageError(f"{log_path.parent}: the run folder is gone (moved or deleted while the "
                         f"run trained in it); its last checkpoint is wherever it went") from None
    accuracy = record["slot_accuracy"]
    shown = {"loss": f"{record['loss']:.3f}", "acc1": f"{accuracy[0]:.2f}",
             "acc_mean": f"{sum(accuracy) / len(accuracy):.2f}", "tau~": f"{record['tau_estimate']:.2f}",
             "tok/s": f"{tokens_per_second:.0f}"}
    if record.get("eval_tau"):
        shown["eval_tau"] = f"{record['eval_tau']:.2f}"
    if "heldout_loss" in record:
        shown["heldout_loss"] = f"{record['heldout_loss']:.3f}"
    bar.set_postfix(shown)
