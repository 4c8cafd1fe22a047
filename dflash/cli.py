"""What every program of this project shares: one-line errors, device and dtype, prompt files.

Bad input (an argument, a file, a checkpoint that does not fit) ends a program with one
`error: ...` line and exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from dflash.checkpoint import CheckpointError, parse_json, read_text
from dflash.tokenizer import Tokenizer, TokenizerError, find_tokenizer, stop_token_ids  # noqa: F401 (for the programs)


class UsageError(ValueError):
    """Bad input: a request, a command line or a file it names. The message is one line."""


USER_ERRORS = (UsageError, CheckpointError, TokenizerError)  # what a user can fix; anything else is a bug


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error:` line (no usage dump) and exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def run_cli(parser: argparse.ArgumentParser, run: Callable[..., int], argv: Sequence[str] | None = None) -> int:
    """Parse, run, and turn every user error into one `error:` line and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """`--device` and `--dtype`, meaning the same in every program."""
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="auto: bfloat16 on CUDA, float32 on CPU")


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when there is one; anything else must exist here, or it is one error line, not a traceback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    usable = device is not None and (device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available()))
    if not usable:
        raise UsageError(f"device {name!r} is not available here (use cpu, auto, or cuda where CUDA is)")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA (what real checkpoints are stored in) and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def int_list(text: str) -> list[int]:
    """An option's `1,9,17` as [1, 9, 17] (argparse `type=`, so a bad value is argparse's one-line error)."""
    try:
        return [int(piece) for piece in text.split(",") if piece.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def check_token_ids(ids: Sequence[int], vocab_size: int, where: str) -> None:
    """Refuse ids the model has no embedding for, naming the first one."""
    outside = [token for token in ids if not 0 <= token < vocab_size]
    if outside:
        raise UsageError(f"{where}: token id {outside[0]} is outside the vocabulary (0..{vocab_size - 1})")


def jsonl_records(path: Path, what: str, whole_lines_only: bool = False) -> Iterator[tuple[str, object]]:
    """("file:line", parsed JSON) for every non-blank line, so that errors name the line.

    `whole_lines_only` skips a last line without its newline: a record a crash cut short.
    """
    text = read_text(path, UsageError, what)
    if whole_lines_only:
        text = text[: text.rfind("\n") + 1]
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{path}:{number}", parse_json(line, f"{path}:{number}", UsageError)


PROMPT_FORMAT = """\
prompt files are JSONL: one object per line, with exactly one of
  {"prompt": "text"}                                  raw text
  {"messages": [{"role": "user", "content": "..."}]}  a conversation, rendered by the chat template
  {"prompt_ids": [1, 2, 3]}                           token ids (no tokenizer needed)
and optionally "answer", the expected final answer (bench.py checks it); other fields are ignored"""

# A prompt file's field: (the Prompt attribute it fills, the type of its value, the type of its items).
PROMPT_FIELDS = {"prompt": ("text", str, str), "messages": ("messages", list, dict), "prompt_ids": ("ids", list, int)}


@dataclass
class Prompt:
    """One prompt: exactly one of text, messages or ids is set."""

    where: str  # "file:line", for error messages
    text: str | None = None
    messages: list[dict] | None = None
    ids: list[int] | None = None
    answer: str | None = None  # the expected final answer, when the file gives one (benchmarks check it)


def parse_prompt(record, where: str) -> Prompt:
    """One line of a prompt file, checked against PROMPT_FORMAT."""
    given = [field for field in PROMPT_FIELDS if field in record] if isinstance(record, dict) else []
    if len(given) != 1:
        raise UsageError(f"{where}: expected an object with exactly one of 'prompt', 'messages' or 'prompt_ids'")
    attribute, kind, item = PROMPT_FIELDS[given[0]]
    value, answer = record[given[0]], record.get("answer")
    if not (value and isinstance(value, kind) and all(isinstance(x, item) for x in value)):
        of_items = "" if kind is str else f" of {item.__name__}"
        raise UsageError(f"{where}: '{given[0]}' must be a non-empty {kind.__name__}{of_items}")
    return Prompt(where, **{attribute: value}, answer=None if answer is None else str(answer))


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt of a prompt file, in order: the one reader of the one format."""
    prompts = [parse_prompt(record, where) for where, record in jsonl_records(path, "prompts file")]
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """Alike everywhere: a drafter trained on prompts rendered otherwise meets a distribution it never learnt."""
    parser.add_argument("--chat", action="store_true", default=None,
                        help="wrap text prompts in the chat template (default: when the tokenizer has one)")
    parser.add_argument("--raw", dest="chat", action="store_false", help="feed text prompts as they are")
    parser.add_argument("--thinking", action="store_true", help="render chat prompts with thinking on")
    parser.add_argument("--no-token-healing", dest="token_healing", action="store_false",
                        help="keep a raw prompt's last token even when it ends mid-token (a trailing newline or space)")


def encode_for_generation(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                          thinking: bool = False, token_healing: bool = True) -> tuple[list[int], list[int] | None]:
    """A prompt's ids, and the first new token's choices when token healing applies (`Tokenizer.heal`), else None.

    Raw text goes through the chat template when `chat`, or by default when the tokenizer has one;
    only text fed as it is gets healed. Thinking is off by default, as the released drafters were trained.
    """
    if prompt.ids is not None:
        return list(prompt.ids), None
    if tokenizer is None:
        raise UsageError(f"{prompt.where}: text prompts need a tokenizer, and the checkpoint folder has none")
    messages = prompt.messages
    if messages is None and (tokenizer.has_chat_template if chat is None else chat):
        messages = [{"role": "user", "content": prompt.text}]
    while messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # a dataset's own answer: the target writes its own
    if messages is None:
        ids = tokenizer.encode(prompt.text)
    else:
        ids = tokenizer.encode_chat(messages, add_generation_prompt=True, enable_thinking=thinking)
    if not ids:
        raise UsageError(f"{prompt.where}: the prompt is empty")
    return tokenizer.heal(ids) if token_healing and messages is None else (ids, None)


def encode_prompt(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                  thinking: bool = False) -> list[int]:
    """A prompt's token ids, never healed (see `encode_for_generation`)."""
    return encode_for_generation(prompt, tokenizer, chat, thinking, token_healing=False)[0]
