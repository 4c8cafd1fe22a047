"""What block_sweep.py and verify_what_pays.py share: their options, and the pair, prompts and
stop tokens those options name."""

from __future__ import annotations

import argparse
from pathlib import Path

import generate
from bench_common import check_report_output
from dflash.cli import add_device_options, pick_device, pick_dtype, positive_int
from dflash.drafter import Drafter
from dflash.prompts import add_prompt_options, encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer, stop_token_ids


def add_sweep_options(p: argparse.ArgumentParser, turns_of: str) -> None:
    """The pair, the prompt set and how the loops run (`turns_of`: what takes turns)."""
    p.add_argument("--model", type=Path, default=generate.WEIGHTS / "tiny-qwen3")
    p.add_argument("--draft", type=Path, default=generate.WEIGHTS / "tiny-qwen3-dflash")
    p.add_argument("--prompts", type=Path, default=generate.WEIGHTS / "heldout_problems.jsonl")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--rounds", type=positive_int, default=3,
                   help=f"turns of every {turns_of} (the least time kept)")
    p.add_argument("--compile", action="store_true", help="torch.compile the fixed-shape passes")
    add_device_options(p)
    add_prompt_options(p)
    p.add_argument("--json", type=Path, help="also write the report to this file")


def load_sweep(args):
    """The device, the target and drafter, the prompts' ids and the stop ids the options name."""
    check_report_output(args.json, "--json",
                        {"--model": args.model, "--draft": args.draft, "--prompts": args.prompts})
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device, args.model)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype)
    tokenizer = find_tokenizer(args.model)
    prompts = [encode_for_generation(p, tokenizer, args.chat, args.thinking, False)[0]
               for p in read_prompts(args.prompts)]
    return device, target, drafter, prompts, stop_token_ids(args.model, tokenizer)
