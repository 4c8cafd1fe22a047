"""A drafter's training data: the target's own answers to prompts, made by `make_data.py` and read
back by `train.py` (which also has the target answer its held-out prompts, to measure tau). Both
scripts stand on this module, never on each other.

A record is one JSONL line: `input_ids` (the prompt, then the answer) and `loss_mask` (1 on the
answer's tokens, 0 on the prompt's), each checked strictly: a `true` is not a token and a `"1"` or
a NaN is not a mask value. Training reads the records as flat arrays (`Sequences`): from JSONL in
memory (5 bytes a token), or memory-mapped from a packed folder (`pack`) that is never read whole,
for data larger than a machine's memory."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch

from dflash.checkpoint import (SIDE_FILE_LIMIT, check_regular_file, parse_json, read_json,
                               write_json_atomically)
from dflash.cli import UsageError, check_token_ids
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling, keep_only, sample
from dflash.tokenizer import TokenizerError
from dflash.training import check_batch


def encode_prompts(path: Path, tokenizer, chat: bool | None, thinking: bool, token_healing: bool,
                   vocab_size: int) -> list[tuple[list[int], list[int] | None]]:
    """(token ids, the first new token's choices or None) per prompt, as `generate.py` renders
    it."""
    prompts = []
    for prompt in read_prompts(path):
        try:
            ids, choices = encode_for_generation(prompt, tokenizer, chat, thinking, token_healing)
        except TokenizerError as err:  # said about the template: this names the record too
            raise UsageError(f"{prompt.where}: {err}") from None
        check_token_ids([*ids, *(choices or [])], vocab_size, prompt.where)
        prompts.append((ids, choices))
    return prompts


@torch.no_grad()
def generate_batch(target: Qwen3, prompts: list[list[int]], max_new_tokens: int,
                   sampling: Sampling | float, stop_ids: Sequence[int],
                   generator: torch.Generator | None, *,
                   first_token_choices: Sequence[list[int] | None] | None = None) -> list[list]:
    """Each prompt's answer, cut after its stop token, left-padded into one cache: `key_padding`
    hides the padding and RoPE sees only differences, so a row computes what it would alone.
    `first_token_choices[row]` heals that row."""
    device = target.embed_tokens.weight.device
    batch, longest = len(prompts), max(len(p) for p in prompts)
    total = longest + max_new_tokens
    padded = [[0] * (longest - len(p)) + p for p in prompts]
    ids = torch.tensor(padded, device=device)  # (batch, longest), 0 = padding
    starts = torch.tensor([longest - len(p) for p in prompts], device=device)  # (batch,)
    key_padding = torch.arange(total, device=device) >= starts[:, None]  # (batch, total): real
    cache = target.new_cache(total, batch)
    hidden, _ = target(ids, cache=cache, key_padding=key_padding)  # (batch, longest, hidden)
    logits = target.logits(hidden[:, -1])  # (batch, vocab)
    cache.commit(longest)  # the prompts are committed
    if first_token_choices is not None:  # token healing, the first step only
        logits = torch.stack([row if allowed is None else keep_only(row, allowed)
                              for row, allowed in zip(logits, first_token_choices)])  # (batch, V)
    answers: list[list[int]] = [[] for _ in prompts]
    finished = [False] * batch
    for position in range(longest, total):
        tokens = sample(logits, sampling, generator)  # (batch,)
        for row, token in enumerate(tokens.tolist()):
            if not finished[row]:
                answers[row].append(token)
                finished[row] = token in stop_ids
        if all(finished) or position == total - 1:
            break
        hidden, _ = target(tokens[:, None], positions=torch.tensor([position], device=device),
                           cache=cache, key_padding=key_padding)  # (batch, 1, hidden)
        logits = target.logits(hidden[:, -1])  # (batch, vocab)
        cache.commit(1)
    return answers


# ------------------------------------------------------------------ the data as flat arrays


PACKED = {"tokens": np.uint32, "loss_mask": np.uint8, "offsets": np.int64, "first_anchor": np.int64}
MANIFEST, PACKED_FORMAT = "manifest.json", "dflash-packed-1"


class Sequences(NamedTuple):
    """The training sequences as flat arrays (memory-mapped from a packed folder, or built from
    JSONL): sequence i is `tokens[starts[i]:starts[i] + lengths[i]]`, already cut to the limit."""
    tokens: np.ndarray  # (T,) uint32: every sequence's input_ids, one after another
    loss_mask: np.ndarray  # (T,) uint8: 1 on the answers' tokens
    starts: np.ndarray  # (n,) int64
    lengths: np.ndarray  # (n,) int64
    sha256: str  # the data's content hash: what a resume compares
    cut: int  # sequences longer than the limit, cut to it
    tokens_dropped: int  # what the cuts removed
    answer_tokens_dropped: int = 0  # of them, the answers' (labels the drafter never sees)
    dropped: int = 0  # sequences where no block can start (before or after the cut): left out
    vocab_size: int | None = None  # what a batch's ids are checked against as it is read
    source: str = ""  # the file or folder, for the message that says one is wrong


CUTS = ("answer-end", "prompt-start")  # --cut: which end of a too-long sequence goes


def first_anchor(mask: Sequence[int]) -> int:
    """The first position a with x_a and x_{a+1} in the answer (where a block can start), or -1."""
    answer = np.asarray(mask, dtype=bool)
    pairs = np.flatnonzero(answer[:-1] & answer[1:])
    return int(pairs[0]) if len(pairs) else -1


def load_sequences(path: Path, max_seq_len: int, vocab_size: int,
                   target_config: Path | None = None, cut: str = "answer-end") -> Sequences:
    """The data for training, cut to max_seq_len (`cut`: the answer's end goes, or the prompt's
    start, up to the first anchor, then the end); a sequence where no block can start
    (`train.valid_anchor_positions`) is dropped. A packed folder (`pack`) is memory-mapped, read
    only where a batch reads; a JSONL file is read whole into flat arrays. A packed folder made
    for another target (`target_config`, its config.json) is refused."""
    packed = open_packed(path, vocab_size, target_config) if Path(path).is_dir() \
        else read_jsonl(path, vocab_size)
    arrays, sha256 = packed
    offsets, first = arrays["offsets"], arrays["first_anchor"]
    whole_starts, whole_lengths = offsets[:-1], np.diff(offsets)  # (n,) each
    excess = np.maximum(whole_lengths - max_seq_len, 0)  # (n,)
    # tokens before the first anchor are never a label: the prompt's start may go, up to there
    shift = np.minimum(excess, np.maximum(first, 0)) if cut == "prompt-start" \
        else np.zeros_like(excess)
    starts, first = whole_starts + shift, first - shift  # (n,) each
    lengths = np.minimum(whole_lengths - shift, max_seq_len)  # (n,)
    kept = (first >= 0) & (first + 1 < lengths)
    if not kept.any():
        raise UsageError(f"{path}: the dataset yields no valid block (no two answer tokens in a "
                         f"row within --max-seq-len {max_seq_len})")
    too_long = np.flatnonzero(excess)  # the sequences cut
    answer_dropped = sum(int(arrays["loss_mask"][begin:end].sum())  # reads the cut parts only
                         for i in too_long.tolist()
                         for begin, end in ((whole_starts[i], starts[i]),
                                            (starts[i] + lengths[i], offsets[i + 1])))
    return Sequences(arrays["tokens"], arrays["loss_mask"], starts[kept], lengths[kept], sha256,
                     len(too_long), int(excess.sum()), answer_dropped, int((~kept).sum()),
                     vocab_size, str(path))


def split_heldout(sequences: Sequences, count: int) -> tuple[Sequences, Sequences | None]:
    """(what trains, `count` sequences held out or None): the held-out ones are a fixed draw
    (seed 0, not --seed) among the sequences kept, so the same data and limits hold out the same
    sequences whatever the run, and the same under any number of processes."""
    if count == 0:
        return sequences, None
    total = len(sequences.starts)
    if count >= total:
        raise UsageError(f"--heldout {count}: the data has only {total} usable sequences, and "
                         f"some must be left to train on")
    held = np.zeros(total, dtype=bool)
    held[np.random.default_rng(0).choice(total, count, replace=False)] = True

    def part(rows: np.ndarray) -> Sequences:
        return sequences._replace(starts=sequences.starts[rows], lengths=sequences.lengths[rows])

    return part(~held), part(held)


def read_jsonl(path: Path, vocab_size: int) -> tuple[dict, str]:
    """A JSONL data file's records, checked, as the flat arrays of a packed folder, and their hash
    (the same as the packed folder's: a run may resume on either)."""
    ids, masks, lengths, anchors, digest = [], [], [0], [], hashlib.sha256()
    for record_ids, mask in checked_records(path, vocab_size):
        ids.append(record_ids)
        masks.append(mask)
        digest.update(record_ids.tobytes() + mask.tobytes())
        lengths.append(len(record_ids))
        anchors.append(first_anchor(mask))
    arrays = {"tokens": np.concatenate(ids) if ids else np.zeros(0, np.uint32),
              "loss_mask": np.concatenate(masks) if masks else np.zeros(0, np.uint8),
              "offsets": np.cumsum(lengths, dtype=np.int64),
              "first_anchor": np.asarray(anchors, dtype=np.int64)}
    return arrays, digest.hexdigest()


def checked_records(path: Path, vocab_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each record of a JSONL data file, checked (`checked_record`), as (uint32 ids, uint8 mask):
    one line in memory at a time. Every way reading fails is one error naming the file; what is
    no regular file (a FIFO would wait for a writer forever) is refused before it is opened."""
    check_regular_file(path, UsageError, "data file")
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    where = f"{path}:{number}"
                    record = parse_json(line, where, UsageError)
                    ids, mask = checked_record(record, where, vocab_size)
                    yield np.asarray(ids, dtype=np.uint32), np.asarray(mask, dtype=np.uint8)
    except FileNotFoundError:
        raise UsageError(f"{path}: data file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read the data file ({err})") from None


def made_with_thinking(path: Path) -> bool:
    """Whether make_data.py rendered the data's prompts with thinking on: its settings, in a packed
    folder's manifest or on a JSONL file's first record. False where they are not said (data made
    elsewhere): the chat template's default for an answer without a reasoning trace."""
    try:
        if Path(path).is_dir():
            record = read_json(Path(path) / MANIFEST, UsageError, MANIFEST, SIDE_FILE_LIMIT)
        else:
            check_regular_file(path, UsageError, "data file")
            with open(path, encoding="utf-8") as file:
                record = parse_json(file.readline() or "{}", path, UsageError)
    except (OSError, ValueError):  # unreadable here: load_sequences says why, in one line
        return False
    settings = record.get("settings") if isinstance(record, dict) else None
    return isinstance(settings, dict) and settings.get("thinking") is True


def packed_folder_mark(folder: Path) -> None:
    """Refuse to replace `folder` unless it is absent, empty or packed data (its manifest says
    the format): --pack deletes what it replaces, and a user's folder is not ours to delete."""
    folder = Path(folder)
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    try:
        manifest = read_json(folder / MANIFEST, UsageError, MANIFEST, SIDE_FILE_LIMIT)
    except UsageError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != PACKED_FORMAT:
        raise UsageError(f"--pack {folder}: {holds(folder)}, not a packed folder of "
                         f"make_data.py (no {MANIFEST} of format {PACKED_FORMAT}); it is "
                         f"replaced only then: name another folder")


def holds(folder: Path) -> str:
    """What a folder holds, in a few words: "holds notes.txt and 3 more"."""
    names = sorted(path.name for path in Path(folder).iterdir())
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"holds {names[0]}{more}" if names else "is empty"


def pack(jsonl: Path, folder: Path, vocab_size: int, identity: dict) -> int:
    """Write make_data.py's JSONL as a packed folder: a flat token file, the loss masks, where each
    sequence starts and where its first block can, and `manifest.json` (the format, the sizes, the
    content hash and `identity`: which target made it). One record in memory at a time; the folder
    appears whole, under its name, only when it is complete (a full disk, a bad record or Ctrl-C
    leave what was there). Only packed data is replaced (`packed_folder_mark`). Returns the
    sequences written."""
    folder = Path(folder)
    packed_folder_mark(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.", suffix=".partial"))
    try:
        count = write_packed(jsonl, partial, vocab_size, identity)
        os.chmod(partial, 0o755)  # mkdtemp makes owner-only folders; data is meant to be shared
        aside = partial.with_suffix(".old")
        if folder.exists():
            os.replace(folder, aside)  # removed once the new one is in place
        os.replace(partial, folder)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:  # a bad record, a full disk, Ctrl-C: no half folder is left
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return count


def write_packed(jsonl: Path, partial: Path, vocab_size: int, identity: dict) -> int:
    """`pack`'s files, written into the (new, empty) folder `partial`."""
    digest, offsets, anchors, largest = hashlib.sha256(), [0], [], -1
    with open(partial / "tokens.bin", "wb") as tokens, \
            open(partial / "loss_mask.bin", "wb") as masks:
        for ids, mask in checked_records(jsonl, vocab_size):
            tokens.write(ids.tobytes())
            masks.write(mask.tobytes())
            digest.update(ids.tobytes() + mask.tobytes())
            offsets.append(offsets[-1] + len(ids))
            anchors.append(first_anchor(mask))
            largest = max(largest, int(ids.max(initial=0)))
    np.asarray(offsets, dtype=np.int64).tofile(partial / "offsets.bin")
    np.asarray(anchors, dtype=np.int64).tofile(partial / "first_anchor.bin")
    manifest = {"format": PACKED_FORMAT, "sequences": len(anchors), "tokens": offsets[-1],
                "largest_token_id": largest, "sha256": digest.hexdigest(), **identity}
    write_json_atomically(partial / MANIFEST, manifest)
    return len(anchors)


def open_packed(folder: Path, vocab_size: int, target_config: Path | None) -> tuple[dict, str]:
    """A packed folder's arrays, memory-mapped, and its content hash, after checking its manifest
    against the files and the target, and the files against the manifest (`check_packed`)."""
    manifest = read_json(folder / MANIFEST, UsageError, "packed data's manifest", SIDE_FILE_LIMIT)
    if not isinstance(manifest, dict) or manifest.get("format") != PACKED_FORMAT:
        raise UsageError(f"{folder}: not a packed data folder of make_data.py ({MANIFEST} "
                         f"has no format {PACKED_FORMAT!r})")
    largest = manifest.get("largest_token_id")
    if type(largest) is not int or largest >= vocab_size:
        raise UsageError(f"{folder}: holds token id {largest}, outside the target's vocabulary "
                         f"(0..{vocab_size - 1})")
    made_for = manifest.get("target_config_sha256")
    if None not in (target_config, made_for) and made_for != content_hash(target_config):
        raise UsageError(f"{folder}: made by another target (its config.json differs from "
                         f"{target_config}): a drafter learns the answers of the target it serves")
    counts = {name: manifest.get(name) for name in ("tokens", "sequences")}
    for name, count in counts.items():
        if type(count) is not int or count < 0:
            raise UsageError(f"{folder / MANIFEST}: {name} must be an integer >= 0, got {count!r}")
    sizes = {"tokens": counts["tokens"], "loss_mask": counts["tokens"],
             "offsets": counts["sequences"] + 1, "first_anchor": counts["sequences"]}
    arrays = {}
    for name, dtype in PACKED.items():
        path = folder / f"{name}.bin"
        expected = sizes[name] * np.dtype(dtype).itemsize
        if not path.is_file() or path.stat().st_size != expected:
            raise UsageError(f"{path}: missing, or not the {sizes[name]} entries {MANIFEST} says "
                             f"(a copy cut short?)")
        arrays[name] = np.memmap(path, dtype=dtype, mode="r") if expected \
            else np.zeros(0, dtype=dtype)
    return arrays, check_packed(folder, arrays, manifest.get("sha256"), vocab_size)


def check_packed(folder: Path, arrays: dict, sha256, vocab_size: int) -> str:
    """The packed arrays' content hash, after one pass checking that they say what make_data.py
    wrote: offsets rising from 0 to the token count, each sequence's first anchor where its
    answer's first two tokens in a row are, ids in the vocabulary, a mask of 0s and 1s, and the
    hash the manifest records (if any). Streams the files once, some million tokens at a time."""
    tokens, mask, offsets, anchors = (arrays[name] for name in PACKED)
    if offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
        raise UsageError(f"{folder}: offsets.bin does not rise from 0 to the {len(tokens)} tokens "
                         f"(entries out of order or past the end)")
    digest, first = hashlib.sha256(), 0
    while first < len(anchors):  # sequences first..last-1: at least one, about CHUNK tokens
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + CHUNK, "right")) - 1)
        bounds = np.asarray(offsets[first:last + 1]) - offsets[first]  # (k + 1,): in the chunk
        ids = np.asarray(tokens[offsets[first]:offsets[last]])
        answer = np.asarray(mask[offsets[first]:offsets[last]])
        check_batch(ids, answer, vocab_size, f"{folder}: sequences {first}..{last - 1}")
        found = first_anchors(answer, bounds)  # (k,)
        wrong = np.flatnonzero(found != np.asarray(anchors[first:last]))
        if len(wrong):
            index = first + int(wrong[0])
            raise UsageError(f"{folder}: sequence {index}: first_anchor.bin says "
                             f"{anchors[index]}, its loss mask {found[wrong[0]]}")
        for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # as the JSONL hashes
            digest.update(ids[begin:end])
            digest.update(answer[begin:end])
        first = last
    if sha256 is not None and sha256 != digest.hexdigest():
        raise UsageError(f"{folder}: the data's sha256 is not the {MANIFEST}'s (changed since "
                         f"make_data.py packed it?)")
    return digest.hexdigest()


CHUNK = 1 << 24  # tokens `check_packed` reads at a time: 80 MiB of ids and masks


def first_anchors(mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """`first_anchor` of each sequence of a flat 0/1 mask, sequence i at bounds[i]..bounds[i+1]:
    (k,), -1 where none; vectorised, the same positions one call per sequence would give."""
    pairs = np.flatnonzero(mask[:-1] & mask[1:])  # a such that a and a + 1 are in an answer
    starts, ends = bounds[:-1], bounds[1:]
    after = np.searchsorted(pairs, starts)  # each sequence's first pair at or after its start
    found = pairs[np.minimum(after, len(pairs) - 1)] if len(pairs) else np.zeros_like(starts)
    inside = (after < len(pairs)) & (found + 1 < ends)
    return np.where(inside, found - starts, -1)


def cut_note(sequences: Sequences, limit: int, max_seq_len: int, cut: str) -> str:
    """The line that says what a cut left out, and why: --max-seq-len, or the target's positions
    (a drafter trained past them would learn positions the target never had)."""
    why = "--max-seq-len" if limit == max_seq_len else \
        f"the target's max_position_embeddings, below --max-seq-len {max_seq_len}"
    where = "at the end" if cut == "answer-end" else "at the prompt's start (then the end)"
    dropped = f"; {sequences.dropped} sequence(s) with no block left out" if sequences.dropped \
        else ""
    return (f"note: {sequences.cut} sequence(s) longer than {limit} tokens ({why}) were cut "
            f"{where} (--cut {cut}): {sequences.tokens_dropped} tokens left out, "
            f"{sequences.answer_tokens_dropped} of them answer tokens{dropped}")


def checked_record(record, where: str, vocab_size: int) -> tuple[list[int], list[int]]:
    """A record's (input_ids, loss_mask), refused in one line unless they are lists of equal length,
    of token ids (integers, not booleans) in the vocabulary and of 0s and 1s."""
    ids, mask = (record.get("input_ids"), record.get("loss_mask")) if isinstance(record, dict) \
        else (None, None)
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
        raise UsageError(f"{where}: needs input_ids and loss_mask lists of equal length")
    if any(type(i) is not int or not 0 <= i < vocab_size for i in ids):  # True is an int too
        raise UsageError(f"{where}: input_ids must be integers in 0..{vocab_size - 1}")
    if any(type(m) is not int or m not in (0, 1) for m in mask):  # NaN, "1", true: refused
        raise UsageError(f"{where}: loss_mask must hold only the integers 0 and 1")
    return ids, mask


def content_hash(path: Path) -> str:
    """The file's SHA-256: what a resume compares, so that a data file changed under the same name
    is noticed (its path alone says nothing)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
