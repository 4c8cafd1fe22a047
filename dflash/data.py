"""A drafter's training data: the target's own answers to prompts, made by `make_data.py` and read
back by `train.py` (which also has the target answer its held-out prompts, to measure tau). Both
scripts stand on this module, never on each other.

A record is one JSONL line: `input_ids` (the prompt, then the answer) and `loss_mask` (1 on the
answer's tokens, 0 on the prompt's), each checked strictly: a `true` is not a token and a `"1"` or
a NaN is not a mask value."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple, Sequence

import torch

from dflash.cli import UsageError, check_token_ids, jsonl_records
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling, keep_only, sample


def encode_prompts(path: Path, tokenizer, chat: bool | None, thinking: bool, token_healing: bool,
                   vocab_size: int) -> list[tuple[list[int], list[int] | None]]:
    """(token ids, the first new token's choices or None) per prompt, as `generate.py` renders
    it."""
    prompts = []
    for prompt in read_prompts(path):
        ids, choices = encode_for_generation(prompt, tokenizer, chat, thinking, token_healing)
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
    cache.extend(longest)  # the prompts are committed
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
        cache.extend(1)
    return answers


class Sequences(NamedTuple):
    """The training sequences as read: (input_ids, loss_mask) pairs, and how many were cut."""
    pairs: list[tuple[list[int], list[int]]]
    cut: int  # sequences longer than the limit, cut to it
    tokens_dropped: int  # what the cuts removed


def load_sequences(path: Path, max_seq_len: int, vocab_size: int) -> Sequences:
    """The data read back for training, cut to max_seq_len (the answer's end goes first); a sequence
    where no block can start (a block needs two answer tokens in a row:
    `train.valid_anchor_positions`) is dropped."""
    pairs, cut, dropped = [], 0, 0
    for where, record in jsonl_records(path, "data file"):
        ids, mask = checked_record(record, where, vocab_size)
        if len(ids) > max_seq_len:
            cut, dropped = cut + 1, dropped + len(ids) - max_seq_len
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
        if any(this and following for this, following in zip(mask, mask[1:])):
            pairs.append((ids, mask))
    if not pairs:
        raise UsageError(f"{path}: the dataset yields no valid block (no two answer tokens in a "
                         f"row within --max-seq-len {max_seq_len})")
    return Sequences(pairs, cut, dropped)


def cut_note(sequences: Sequences, limit: int, max_seq_len: int) -> str:
    """The line that says what a cut left out, and why: --max-seq-len, or the target's positions
    (a drafter trained past them would learn positions the target never had)."""
    why = "--max-seq-len" if limit == max_seq_len else \
        f"the target's max_position_embeddings, below --max-seq-len {max_seq_len}"
    return (f"note: {sequences.cut} sequence(s) longer than {limit} tokens ({why}) were cut at the "
            f"end: {sequences.tokens_dropped} tokens left out")


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
