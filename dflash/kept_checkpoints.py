"""The checkpoints a run keeps besides its newest, which `train.py` writes into `--out` itself:
with `--keep K` the last K as `checkpoints/step-N/`, and with `--heldout` the one of the lowest
held-out loss as `best/` (`best.json` says its step and loss). A kept checkpoint's files are hard
links to the newest one's (copies where the file system has no links): keeping one costs no disk
until the newest is overwritten.

Each kept folder is filled under a `.partial` name and renamed when complete, and an older one
is deleted only after that: a crash leaves a `.partial` folder, never picked and removed on the
next start, and every folder under its own name is whole."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dflash.checkpoint import is_number, read_side_file, sync_to_disk, write_json_atomically

CHECKPOINTS, BEST = "checkpoints", "best"  # in a run's folder
BEST_RECORD = "best.json"  # in best/: {"step": ..., "heldout_loss": ...}
STEP_FOLDER = re.compile(r"step-(\d+)")


def kept_steps(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete `checkpoints/step-N`, oldest first."""
    folder = Path(out) / CHECKPOINTS
    found = [(int(match.group(1)), path) for path in folder.glob("step-*")
             if (match := STEP_FOLDER.fullmatch(path.name)) and path.is_dir()]
    return sorted(found)


def training_states(out: Path, state_name: str) -> list[Path]:
    """The training states a resume may start from, newest first: `--out`'s own (written before
    any copy of it), then the kept ones."""
    paths = [Path(out) / state_name] + [folder / state_name for _, folder in kept_steps(out)[::-1]]
    return [path for path in paths if path.is_file()]


def keep_last(out: Path, step: int, keep: int, names: tuple[str, ...]) -> None:
    """After step `step`'s checkpoint (the files `names` in `out`) is complete: with `keep` > 1,
    copy it to `checkpoints/step-N`, then delete all but the newest `keep` of those; with 1,
    none is kept but the newest in `out`."""
    if keep > 1:
        folder = Path(out) / CHECKPOINTS / f"step-{step:08d}"
        put_in_place(filled_copy(out, names, folder, {}), folder)
    kept = kept_steps(out)
    for _, folder in kept[:max(0, len(kept) - (keep if keep > 1 else 0))]:
        shutil.rmtree(folder)


def best_loss(out: Path) -> float | None:
    """The held-out loss of the checkpoint kept in `best/`, or None where there is none, or its
    record is not one (said in a note): the next evaluation's checkpoint then takes its place."""
    record = read_side_file(Path(out) / BEST / BEST_RECORD, "best checkpoint's record",
                            lambda value: None if isinstance(value, dict) and is_number(
                                value.get("heldout_loss")) else "no finite 'heldout_loss'")
    return None if record is None else record["heldout_loss"]


def keep_best(out: Path, step: int, loss: float, names: tuple[str, ...]) -> None:
    """Make step `step`'s checkpoint in `out` (the files `names`) the one `best/` keeps."""
    record = {BEST_RECORD: {"step": step, "heldout_loss": loss}}
    put_in_place(filled_copy(out, names, Path(out) / BEST, record), Path(out) / BEST)


def filled_copy(out: Path, names: tuple[str, ...], folder: Path, records: dict) -> Path:
    """`folder.partial`, holding links to (or copies of) `out`'s files `names` and `records`
    (name: JSON) written beside them, all on the disk."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in names:
        try:
            os.link(Path(out) / name, partial / name)
        except OSError:  # no hard links here (some network file systems): a copy
            shutil.copyfile(Path(out) / name, partial / name)
            sync_to_disk(partial / name)
    for name, record in records.items():
        write_json_atomically(partial / name, record)
    sync_to_disk(partial)
    return partial


def put_in_place(partial: Path, folder: Path) -> None:
    """Rename the complete `partial` to `folder`; a folder already there is renamed aside first
    and deleted only once the new one is in place (`remove_unfinished` undoes a crash between)."""
    aside = folder.with_name(folder.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    if folder.exists():
        os.replace(folder, aside)
    os.replace(partial, folder)
    sync_to_disk(folder.parent)
    shutil.rmtree(aside, ignore_errors=True)


def remove_unfinished(out: Path) -> None:
    """What a crash while keeping a checkpoint left: a `.partial` folder goes, and a folder
    renamed aside whose replacement never arrived comes back."""
    for pattern in (f"{BEST}.*", f"{CHECKPOINTS}/step-*.*"):
        for path in sorted(Path(out).glob(pattern)):
            if path.suffix == ".old" and not path.with_suffix("").exists():
                os.replace(path, path.with_suffix(""))
            elif path.suffix in (".old", ".partial"):
                shutil.rmtree(path)
