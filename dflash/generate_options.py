"""generate.py's command line: its options, their examples, and the checks made before any load.

Kept apart from generate.py, which a reader follows one DFlash step through: its command reads the
request checked here (`read_request`), calls the loops and reports them here (`print_report`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash.checkpoint import checkpoint_folder
from dflash.cli import (OneLineErrors, add_device_options, checked, int_list, pick_device,
                        pick_dtype, positive_int, seed)
from dflash.errors import UsageError
from dflash.prompts import Prompt, add_prompt_options, check_prompt_options, encode_for_generation
from dflash.results import Generation
from dflash.sampling import GREEDY_BELOW, Sampling, add_sampling_options, sampling_of
from dflash.tokenizer import Tokenizer, find_tokenizer

WEIGHTS = Path(__file__).resolve().parents[1] / "weights"  # the demo pair and its problem sets


EXAMPLES = """\
examples:
  python generate.py --prompt "Mia has 14 apples. She buys 9 more. How many apples are there now?"
  python generate.py --prompt "Leo buys 3 pens that cost 4 dollars each. He pays with 20 dollars. \
How much change does Leo get?" --compare --tree 16
  python generate.py --prompt "Tom had 30 marbles. He gave away 12. How many marbles does Tom have \
left?" --sample-from-config --draft-policy mixed:2
  python generate.py --prompt-ids 1,2,3 --model tests/fixtures/qwen3-tiny-sharded --draft \
tests/fixtures/dflash-tiny --json
  python generate.py --prompt "Sam reads 12 pages a day. How many pages does he read in 5 days?" \
--block-size auto --compile

On a terminal, tokens from accepted drafts are green. Bad input exits with status 2.
"""


def block_size_option(text: str) -> int | str:
    """--block-size: `auto`, or a block of at least 2 tokens."""
    return "auto" if text == "auto" else checked(int, "at least 2 or auto", lambda x: x >= 2)(text)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description="Generate with a Qwen3 target, sped up by a DFlash drafter.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    either = p.add_mutually_exclusive_group()
    either.add_argument("--prompt", help="the prompt text")
    either.add_argument("--prompt-ids", type=int_list,
                        help="the prompt as token ids, e.g. 1,2,3 (needs no tokenizer)")
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3",
                   help="target checkpoint folder (default: weights/tiny-qwen3, the demo target)")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash",
                   help="drafter checkpoint folder (default: weights/tiny-qwen3-dflash, the demo "
                   "drafter)")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding only")
    p.add_argument("--compare", action="store_true",
                   help="run the baseline, then DFlash, and report the speedup")
    p.add_argument("--max-new-tokens", type=positive_int, default=128,
                   help="stop after this many new tokens, unless a stop token comes first "
                   "(default 128)")
    add_sampling_options(p)
    p.add_argument("--seed", type=seed, default=0,
                   help="seeds the sampling's random draws (default 0)")
    p.add_argument("--block-size", type=block_size_option, metavar="N|auto",
                   help="tokens per draft block (2..the drafter's; default the drafter's); auto: "
                   "the block this machine runs fastest, from a calibration of its pass costs "
                   "(kept per machine and model) and the drafter's acceptance")
    p.add_argument("--tree", type=checked(int, "0 (no tree) or more", lambda x: x >= 0), default=0,
                   metavar="N", help="verify a draft tree of N nodes per step")
    add_device_options(p)
    compiled = p.add_mutually_exclusive_group()  # both given: which was meant?
    compiled.add_argument("--compile", action="store_true", default=None,
                          help="torch.compile the fixed-shape passes (default: on for CUDA, off "
                          "for CPU)")
    compiled.add_argument("--no-compile", dest="compile", action="store_false",
                          help="run the passes eagerly, also on CUDA")
    p.add_argument("--flex-attention", action="store_true",
                   help="read the caches through FlexAttention, only their filled blocks (compiled "
                   "passes only, for CUDA; not yet measured on a GPU)")
    add_prompt_options(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the text: output_ids, text, "
                   "acceptance_lengths, mean_acceptance, tokens_per_second, new_tokens, steps "
                   "(with --compare also baseline_output_ids, baseline_tokens_per_second, speedup)")
    return p


def check_filters(args, sampling: Sampling) -> None:
    """Refuse --top-k, --top-p or --min-p given for a greedy run: the argmax takes no filter."""
    if not sampling.greedy:
        return
    for option in ("top_k", "top_p", "min_p"):
        if getattr(args, option) is not None:
            source = " (the model's generation_config.json has do_sample off)" \
                if args.sample_from_config and args.temperature is None else ""
            raise UsageError(f"--{option.replace('_', '-')} filters sampled tokens, and the run "
                             f"is greedy{source}: give a --temperature above {GREEDY_BELOW:g}, "
                             "or drop it")


def check_compile(args, device) -> bool:
    """Whether the passes are compiled (default: on CUDA); --flex-attention without them refused."""
    compile = device.type == "cuda" if args.compile is None else args.compile
    if args.flex_attention and not compile:
        raise UsageError(f"--flex-attention reads the caches in compiled passes only, and on "
                         f"{device} they are not compiled unless --compile is given")
    return compile


def check_options(args) -> Prompt:
    """The prompt the options give; options that contradict each other, or one the run would
    ignore, are refused before any model is loaded."""
    if args.prompt is None and args.prompt_ids is None:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-ids 1,2,3")
    if args.block_size == "auto" and (args.tree or args.draft_policy != "greedy"):
        raise UsageError("--block-size auto is chosen for greedy chains: give a number with "
                         "--tree or a sampled --draft-policy")
    if args.tree and args.draft_policy != "greedy":
        raise UsageError("--tree takes only the greedy draft policy")
    ignored = {"--compare": args.compare, "--tree": args.tree, "--block-size": args.block_size,
               "--draft-policy": args.draft_policy != "greedy"}
    for option, given in ignored.items():
        if args.no_draft and given:
            raise UsageError(f"--no-draft decodes without the drafter, which {option} needs: "
                             "give one of them")
    if args.flex_attention and args.compile is False:
        raise UsageError("--flex-attention reads the caches in compiled passes only, which "
                         "--no-compile turns off: give one of them")
    check_prompt_options(args, ids_given=args.prompt_ids is not None)
    if not args.sample_from_config:  # else once the file is read (`read_request`)
        check_filters(args, Sampling(args.temperature or 0.0))
    return (Prompt("--prompt", text=args.prompt) if args.prompt_ids is None
            else Prompt("--prompt-ids", ids=args.prompt_ids))




@dataclass
class Request:
    """What the command line asks for, checked before any model loads."""

    prompt: Prompt
    prompt_ids: list[int]
    first_token_choices: list[int] | None  # token healing's, or None
    sampling: Sampling
    tokenizer: Tokenizer | None
    device: torch.device
    dtype: torch.dtype
    compile: bool


def read_request(args) -> Request:
    """The request the options give, every check that needs no model made: the options, the
    checkpoint folders, the device, the sampling and the prompt's encoding."""
    prompt = check_options(args)
    checkpoint_folder(args.model, "model", UsageError)  # before its tokenizer is looked for
    if not args.no_draft:
        checkpoint_folder(args.draft, "drafter", UsageError)
    device = pick_device(args.device)
    compile = check_compile(args, device)
    dtype = pick_dtype(args.dtype, device, args.model)
    sampling, tokenizer = sampling_of(args, args.model), find_tokenizer(args.model)
    check_filters(args, sampling)
    prompt_ids, choices = encode_for_generation(prompt, tokenizer, args.chat, args.thinking,
                                                args.token_healing)
    return Request(prompt, prompt_ids, choices, sampling, tokenizer, device, dtype, compile)


def print_report(args, request: Request, results: dict[str, Generation], block_size: int,
                 warm_up: float) -> None:
    """The runs' report: one JSON object (--json) on standard output, else lines on standard
    error, one per loop, and the speedup with --compare."""
    final, slow = list(results.values())[-1], results.get("baseline") if args.compare else None
    if args.json:
        tokenizer = request.tokenizer
        text = tokenizer.decode(final.new_ids, skip_special_tokens=True) if tokenizer else ""
        print(json.dumps(final.report(text, slow)))
        return
    print(f"[device {request.device}, {str(request.dtype).removeprefix('torch.')}, batch 1, "
          f"compile {'on' if request.compile else 'off'}, {request.sampling}, warm-up "
          f"{warm_up:.1f} s]", file=sys.stderr)
    for name, result in results.items():
        print(result.summary(name, block_size), file=sys.stderr)
    if slow is not None:
        print(f"speedup: {final.speedup_over(slow):.2f}x{final.too_short_note()}", file=sys.stderr)
