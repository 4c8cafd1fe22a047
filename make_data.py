"""Let a Qwen3 target answer prompts: a drafter's training data, written here, read by `train.py`.

A drafter must guess what *this* target says, so it learns the target's own answers to prompts rendered as
`generate.py` renders them, one JSONL line per prompt (`index` makes the file resumable; `input_ids` is the prompt,
its last tokens if too long for the context, then the answer; `loss_mask` is 1 on the answer only; `settings`, how the
answer was made, so that a resumed file never mixes answers made two ways):
    {"index": 7, "input_ids": [151644, 872, ..., 151645], "loss_mask": [0, 0, ..., 1, 1], "settings": {...}}
With --pack, the file is also written packed (dflash/data.py): flat arrays train.py memory-maps."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from dflash.cli import (OneLineErrors, UsageError, add_device_options, check_output, jsonl_records,
                        pick_device, pick_dtype, positive_int, refuse_overlap, run_cli, seed)
from dflash.data import content_hash, encode_prompts, generate_batch, pack, packed_folder_mark
from dflash.prompts import PROMPT_FORMAT, add_prompt_options, check_prompt_options
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling, add_sampling_options, sampling_of
from dflash.tokenizer import find_tokenizer, stop_token_ids


def answer_settings(args: argparse.Namespace, sampling: Sampling) -> dict:
    """Everything besides its prompt that shapes an answer, as a record stores it."""
    return {"max_new_tokens": args.max_new_tokens, "sampling": str(sampling), "seed": args.seed, "chat": args.chat,
            "thinking": args.thinking, "token_healing": args.token_healing}


def done_indices(path: Path, settings: dict | None = None) -> set[int]:
    """The indices of the prompts `path` already answers; a record made with other `settings` is refused.
    Only reads: the file is left as it is."""
    done = set()
    records = jsonl_records(path, "data file", whole_lines_only=True) if path.exists() else []
    for where, record in records:  # whole lines only: a line a crash cut short has no answer yet
        index = record.get("index") if isinstance(record, dict) else None
        if not isinstance(index, int) or isinstance(index, bool):
            raise UsageError(f"{where}: no integer 'index' (not a record of make_data.py)")
        if settings is not None and record.get("settings", settings) != settings:  # an older file has none
            raise UsageError(f"{where}: answered with the settings {json.dumps(record['settings'])}, this run's are "
                             f"{json.dumps(settings)} (resume with the same options, or write to another --out)")
        done.add(index)
    return done


def cut_torn_line(path: Path) -> None:
    """Cut off a half-written last line (a crash mid-append), so appended records start whole."""
    if path.exists():
        with open(path, "rb+") as file:
            file.truncate(file.read().rfind(b"\n") + 1)


def append_records(path: Path, records: list[dict]) -> None:
    """Append `records` as whole JSONL lines, or nothing: a write that fails (a full disk, Ctrl-C)
    is cut back to where it began, and a file or folder made for it goes again, so the file only
    ever holds whole records and a failed first write leaves no trace."""
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab", buffering=0) as file:  # unbuffered: what failed is known, and undone
        start = file.tell()
        try:
            write_all(file, "".join(json.dumps(record) + "\n" for record in records).encode())
        except BaseException:
            file.truncate(start)
            if not existed:
                path.unlink()
                for folder in made:  # innermost first
                    folder.rmdir()
            raise


def write_all(file, data: bytes) -> None:
    """Write every byte of `data` to an unbuffered file (a raw write may write only a part)."""
    view = memoryview(data)
    while view:
        view = view[file.write(view):]


def make_data(args: argparse.Namespace) -> int:
    """Answer every prompt `--out` does not answer yet, a batch at a time, appending as we go."""
    check_prompt_options(args)
    check_output(args.out, "--out")
    if args.pack:
        if not args.pack.name:  # "" or ".": the packed files need a folder of their own
            raise UsageError(f"--pack {str(args.pack)!r}: name a folder for the packed data")
        check_output(args.pack, "--pack", folder=True)
    refuse_overlap({"--out": args.out, "--pack": args.pack},
                   {"--target": args.target, "--prompts": args.prompts, "--tokenizer": args.tokenizer})
    if args.pack:
        packed_folder_mark(args.pack)  # checked now, not after the answers are made
    sampling = sampling_of(args, args.target)
    settings = answer_settings(args, sampling)
    done = done_indices(args.out, settings)
    device = pick_device(args.device)
    target = Qwen3.from_pretrained(args.target, device=device, dtype=pick_dtype(args.dtype, device, args.target))
    tokenizer_folder = args.tokenizer or args.target
    tokenizer = find_tokenizer(tokenizer_folder, required=args.tokenizer is not None)
    prompts = encode_prompts(args.prompts, tokenizer, args.chat, args.thinking, args.token_healing,
                             target.config.vocab_size)
    context = target.config.max_position_embeddings
    if args.max_new_tokens >= context:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in the target's "
                         f"context of {context} positions (max_position_embeddings)")
    room = context - args.max_new_tokens
    cut = [len(ids) - room for ids, _ in prompts if len(ids) > room]
    if cut:  # never silently: the answer then follows a prompt without its start
        print(f"note: {len(cut)} prompt(s) longer than {room} tokens (the target's {context} "
              f"positions less --max-new-tokens) keep their last {room}: {sum(cut)} tokens left "
              f"out", file=sys.stderr)
    prompts = [(ids[-room:], choices) for ids, choices in prompts]  # the last tokens fit
    stop_ids = stop_token_ids(tokenizer_folder, tokenizer)
    strangers = sorted(i for i in done if not 0 <= i < len(prompts))
    if strangers:
        raise UsageError(f"{args.out}: answers prompt {strangers[0]}, but {args.prompts} has only {len(prompts)} "
                         f"(written for another prompt file?)")
    pending = [i for i in range(len(prompts)) if i not in done]
    generator = None if sampling.greedy else torch.Generator(device).manual_seed(args.seed)
    cut_torn_line(args.out)
    with tqdm(total=len(prompts), initial=len(done), unit="prompt") as bar:
        for start in range(0, len(pending), args.batch_size):
            indices = pending[start:start + args.batch_size]
            batch, choices = [prompts[i][0] for i in indices], [prompts[i][1] for i in indices]
            answers = generate_batch(target, batch, args.max_new_tokens, sampling, stop_ids,
                                     generator, first_token_choices=choices)
            append_records(args.out, [{"index": i, "input_ids": prompt + answer,  # the format above
                                       "loss_mask": [0] * len(prompt) + [1] * len(answer), "settings": settings}
                                      for i, prompt, answer in zip(indices, batch, answers)])
            bar.update(len(indices))  # a crash loses at most the batch being written
    if args.pack:
        identity = {"target": str(args.target), "settings": settings,
                    "target_config_sha256": content_hash(args.target / "config.json")}
        count = pack(args.out, args.pack, target.config.vocab_size, identity)
        print(f"packed {count} sequences into {args.pack}", file=sys.stderr)
    return 0


EXAMPLES = f"""\
examples:
  # the target answers every prompt (chat template, thinking off, greedy; raw text token-healed);
  # run it again after a crash: answered prompts are skipped
  python make_data.py --target weights/Qwen3-8B --prompts prompts.jsonl --out data.jsonl
  # then train on the answers
  python train.py --target weights/Qwen3-8B --data data.jsonl --out runs/dflash
  # large data: also pack it, a flat token file train.py reads lazily, never whole
  python make_data.py --target weights/Qwen3-8B --prompts prompts.jsonl --out data.jsonl --pack data
  python train.py --target weights/Qwen3-8B --data data --out runs/dflash

{PROMPT_FORMAT}

OUT is JSONL, one {{"index", "input_ids", "loss_mask"}} record per prompt (see the
top of make_data.py). Bad input exits with status 2 and one line on stderr.
"""


def build_parser() -> argparse.ArgumentParser:
    """The options, named as generate.py names the same ones."""
    parser = OneLineErrors(description="Let a Qwen3 target answer prompts: training data for train.py.",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="target checkpoint folder")
    parser.add_argument("--prompts", type=Path, required=True, help="prompt file (format below)")
    parser.add_argument("--out", type=Path, required=True, help="JSONL to append records to (resumed if it exists)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the target's, if it has one)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=512, help="longest answer (default: 512)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="prompts answered at once (default: 16)")
    parser.add_argument("--seed", type=seed, default=0, help="for sampling at temperature > 0 (default: 0)")
    add_sampling_options(parser, draft_policy=False)
    add_prompt_options(parser)
    parser.add_argument("--pack", type=Path, help="then also write OUT as a packed folder train.py "
                        "memory-maps (run again to pack an OUT already complete); a folder there "
                        "is replaced only if it is packed data")
    add_device_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when every prompt is answered, 2 (and one `error:` line) on bad input."""
    return run_cli(build_parser(), make_data, argv)


if __name__ == "__main__":
    sys.exit(main())
