"""What every command-line program of this project shares, written once.

`generate.py`, `train.py`, `make_data.py` and the benchmarks all need the same
handful of things around their real work:

1. **One-line errors.** A bad argument, a missing file or a checkpoint that does not
   fit ends the program with one `error: ...` line on stderr and exit status 2,
   never with a traceback from deep inside torch (`OneLineErrors`, `run_cli`).
2. **Device and dtype**: `auto` means CUDA when there is one, and bf16 there.
3. **A checkpoint's tokenizer**, when its folder has one (plain or compressed).
4. **Prompt files**: one JSONL format, one reader, errors naming file and line.
5. **Stop tokens**: from the tokenizer, or from `generation_config.json` alone.

Nothing here imports a model, so every layer of the project may use it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from dflash.checkpoint import CheckpointError
from dflash.tokenizer import TOKENIZER_FILES, Tokenizer, TokenizerError, eos_ids_of_generation_config, load_tokenizer


class UsageError(ValueError):
    """Bad input: a request, a command line or a file it names. The message is one line."""


# ------------------------------------------------------------------ errors and exit status


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error:` line (no usage dump) and exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


# Every error a user can cause and fix: each carries a message fit to print as it is.
USER_ERRORS = (UsageError, CheckpointError, TokenizerError)  # anything else is a bug: keep its traceback


def run_cli(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
            argv: Sequence[str] | None = None) -> int:
    """Parse, run, and turn every expected failure into one `error:` line and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """`--device` and `--dtype`, with the same meaning in every program."""
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="auto: bfloat16 on CUDA, float32 on CPU")


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """`--chat/--raw`, `--thinking` and `--no-token-healing`: how text becomes the prompt, everywhere alike.

    Generation, benchmarking and making the drafter's data must render prompts the
    same way: a drafter trained on prompts rendered otherwise meets, at inference, a
    distribution it never learnt.
    """
    parser.add_argument("--chat", action="store_true", default=None,
                        help="wrap text prompts in the chat template (default: when the tokenizer has one)")
    parser.add_argument("--raw", dest="chat", action="store_false", help="feed text prompts as they are")
    parser.add_argument("--thinking", action="store_true", help="render chat prompts with thinking on")
    parser.add_argument("--no-token-healing", dest="token_healing", action="store_false",
                        help="keep a raw prompt's last token even when it ends mid-token (a trailing newline or space)")


# ---------------------------------------------------------------------- device and dtype


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when available; otherwise exactly what was asked, if it exists here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r} (use cpu, cuda or auto)") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"device {name!r} is not supported (use cpu, cuda or auto)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} requested but CUDA is not available")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA (what real checkpoints are stored in) and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


# ---------------------------------------------------------------------------- tokenizer


def find_tokenizer(folder: Path, required: bool = False) -> Tokenizer | None:
    """The tokenizer in a checkpoint folder, or None when it has none (fine for token-id prompts)."""
    folder = Path(folder)
    if not required and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    return load_tokenizer(folder)


def stop_token_ids(folder: Path, tokenizer: Tokenizer | None) -> list[int]:
    """Ids that end a reply: the tokenizer's, or without one those of `generation_config.json`."""
    if tokenizer is not None:
        return list(tokenizer.stop_token_ids)
    return eos_ids_of_generation_config(Path(folder))


# -------------------------------------------------------------------------------- prompts

PROMPT_FORMAT = """\
prompt files are JSONL, one prompt per line, as any of:
  "text"                                              raw text (a JSON string)
  {"prompt": "text"} or {"text": "text"}              raw text
  {"messages": [{"role": "user", "content": "..."}]}  a conversation, rendered by the chat template
  {"prompt_ids": [1, 2, 3]}                           token ids (no tokenizer needed)
an object may also give "answer": the expected final answer (the last number of a
correct reply), which bench.py checks; a .txt file is read as one raw-text prompt per line"""


@dataclass
class Prompt:
    """One prompt as a file gives it: exactly one of text, messages or ids is set."""

    where: str  # "file:line", for error messages
    text: str | None = None
    messages: list[dict] | None = None
    ids: list[int] | None = None
    answer: str | None = None  # the expected final answer, when the file gives one (benchmarks check it)


def numbered_lines(path: Path, what: str) -> Iterator[tuple[str, str]]:
    """("file:line", text) for every non-blank line, so that errors can point at the line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: {what} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read the {what} ({err})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{path}:{number}", line


def parse_json_line(line: str, where: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not valid JSON ({err.msg})") from None


def jsonl_records(path: Path, what: str) -> Iterator[tuple[str, object]]:
    """("file:line", parsed JSON) for every non-blank line of a JSONL file; errors name the line."""
    for where, line in numbered_lines(path, what):
        yield where, parse_json_line(line, where)


def parse_prompt(record, where: str) -> Prompt:
    """Check one parsed line against the prompt format and say precisely what is wrong."""
    if isinstance(record, str):
        record = {"text": record}
    if not isinstance(record, dict):
        raise UsageError(f"{where}: expected a JSON string or object, got {type(record).__name__}")
    prompt = parse_prompt_body(record, where)
    if record.get("answer") is not None:
        prompt.answer = str(record["answer"])
    return prompt


def parse_prompt_body(record: dict, where: str) -> Prompt:
    if "prompt_ids" in record:
        ids = record["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise UsageError(f"{where}: prompt_ids must be a non-empty list of integers")
        return Prompt(where, ids=ids)
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise UsageError(f"{where}: messages must be a list of {{'role', 'content'}} objects")
        return Prompt(where, messages=messages)
    kind = next((key for key in ("prompt", "text") if key in record), None)
    if kind is None:
        raise UsageError(f"{where}: no 'prompt', 'text', 'messages' or 'prompt_ids' field")
    if not isinstance(record[kind], str) or not record[kind]:
        raise UsageError(f"{where}: '{kind}' must be a non-empty string")
    return Prompt(where, text=record[kind])


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt of a prompt file (see PROMPT_FORMAT), in order."""
    path = Path(path)
    prompts = []
    for where, line in numbered_lines(path, "prompts file"):
        record = line if path.suffix == ".txt" else parse_json_line(line, where)
        prompts.append(parse_prompt(record, where))
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def encode_prompt(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                  thinking: bool = False) -> list[int]:
    """Token ids for a prompt.

    Conversations always go through the chat template; raw text does when `chat` is
    True, or when `chat` is None and the tokenizer has a template (a chat model is
    then asked the text as a user turn). A raw code model has no template and reads
    the text as it is. Thinking is off by default, as the released drafters were trained.
    """
    if prompt.ids is not None:
        return list(prompt.ids)
    if tokenizer is None:
        raise UsageError(f"{prompt.where}: text prompts need a tokenizer, and the checkpoint folder has none "
                         f"(give token ids instead)")
    messages = prompt.messages
    if messages is None and is_chat(prompt, tokenizer, chat):
        messages = [{"role": "user", "content": prompt.text}]
    if messages is not None:
        while messages and messages[-1].get("role") == "assistant":
            messages = messages[:-1]  # a dataset's own answer: the target writes its own
        ids = tokenizer.encode_chat(messages, add_generation_prompt=True, enable_thinking=thinking)
    else:
        ids = tokenizer.encode(prompt.text)
    if not ids:
        raise UsageError(f"{prompt.where}: the prompt is empty")
    return ids


def is_chat(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None) -> bool:
    """Whether a prompt goes through the chat template (see `encode_prompt`)."""
    if prompt.messages is not None:
        return True
    if prompt.ids is not None or tokenizer is None:
        return False
    return tokenizer.has_chat_template if chat is None else chat


def encode_for_generation(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                          thinking: bool = False, token_healing: bool = True) -> tuple[list[int], list[int] | None]:
    """The prompt's ids for the loops, and the first new token's choices when token healing applies.

    Healing applies to raw text only: a chat prompt ends in the template's own
    tokens, and token ids are taken as given (see `Tokenizer.heal`).
    """
    ids = encode_prompt(prompt, tokenizer, chat, thinking)
    if token_healing and prompt.text is not None and not is_chat(prompt, tokenizer, chat):
        return tokenizer.heal(ids)
    return ids, None


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
