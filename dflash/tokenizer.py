"""Text to token ids and back: a checkpoint's tokenizer, its stop tokens, token healing and Qwen3's chat template."""

from __future__ import annotations

import bisect
import gzip
import json
import lzma
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tokenizers import Tokenizer as RawTokenizer

from dflash.checkpoint import SIZE, check_regular_file, is_integer, read_json
from dflash.errors import TokenizerError

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
MASK = "<|mask|>"  # only in this project's demo tokenizer: the drafter's "blank" token
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# Tried in this order: the plain file wins. Compressed, a test fixture holds Qwen3's 11 MB vocabulary in 1.4 MB.
TOKENIZER_FILES = {"tokenizer.json": lambda data: data, "tokenizer.json.xz": lzma.decompress,
                   "tokenizer.json.gz": gzip.decompress}  # each file's name -> how to get its bytes back


def config_file(path: Path) -> dict:
    """A config file's contents, or {} when the folder does not have it; not an object: refused."""
    if not path.exists():
        return {}
    config = read_json(path, TokenizerError)
    if not isinstance(config, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def find_stop_token_ids(folder: Path, raw: RawTokenizer | None) -> tuple[int, ...]:
    """Every id that ends a reply, in the configs' order, without repeats: Qwen3 needs both `generation_config.json`'s
    ids (`<|endoftext|>`) and, when a vocabulary can look it up, `tokenizer_config.json`'s `eos_token`."""
    folder = Path(folder)
    stop_ids = generation_eos_ids(folder, raw)
    if raw is not None:
        path = folder / "tokenizer_config.json"
        eos_token = config_file(path).get("eos_token")
        eos_token = eos_token.get("content") if isinstance(eos_token, dict) else eos_token  # older files: a dict
        if eos_token is not None and not isinstance(eos_token, str):
            raise TokenizerError(f"{path}: eos_token must be a token's text, got "
                                 f"{json.dumps(eos_token)}")
        if isinstance(eos_token, str):
            if raw.token_to_id(eos_token) is None:
                raise TokenizerError(f"{path}: eos_token {eos_token!r} is not in the vocab")
            stop_ids.append(raw.token_to_id(eos_token))
        stop_ids = stop_ids or [i for i in (raw.token_to_id(IM_END), raw.token_to_id(END_OF_TEXT)) if i is not None]
    return tuple(dict.fromkeys(stop_ids))  # dict keys: a union that keeps the order


def generation_eos_ids(folder: Path, raw: RawTokenizer | None) -> list[int]:
    """`generation_config.json`'s eos_token_id (an id or a list of them) as a list, checked: an id
    no token has could never end a reply, and every reply would run to its limit without a word."""
    path = folder / "generation_config.json"
    eos_ids = config_file(path).get("eos_token_id")
    stop_ids = [eos_ids] if is_integer(eos_ids) else eos_ids if isinstance(eos_ids, list) else None
    if eos_ids is not None and not (stop_ids is not None and all(map(is_integer, stop_ids))):
        raise TokenizerError(f"{path}: eos_token_id must be a token id or a list of them, got "
                             f"{json.dumps(eos_ids)}")
    vocab_size = model_vocab_size(folder)
    if vocab_size is None and raw is not None:
        vocab_size = raw.get_vocab_size(with_added_tokens=True)
    outside = [i for i in stop_ids or [] if vocab_size is not None and not 0 <= i < vocab_size]
    if outside:
        raise TokenizerError(f"{path}: eos_token_id {outside[0]} is outside the vocabulary "
                             f"(0..{vocab_size - 1})")
    return list(stop_ids or [])


def model_vocab_size(folder: Path) -> int | None:
    """The vocabulary the checkpoint's `config.json` declares, when it reads as a valid one (a
    size of 0 or a bad file is the model loader's to report, naming config.json)."""
    try:
        vocab_size = config_file(folder / "config.json").get("vocab_size")
    except TokenizerError:
        return None
    return vocab_size if SIZE[1](vocab_size) else None


def index_of_last_user_query(messages: Sequence[Mapping[str, str]]) -> int:
    """Where the latest real user question (not a wrapped tool result) sits: replies after it keep their reasoning."""
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content") or ""
        is_tool_result = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        if messages[index].get("role") == "user" and not is_tool_result:
            return index
    return len(messages) - 1  # none: as in the official template, no reply counts as "after" it


def apply_qwen3_chat_template(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                              enable_thinking: bool = False) -> str:
    """The text Qwen3's official Jinja chat template renders (without tools), in Python to read and test line by line.
    Qwen3 was trained to see reasoning only in the turn it is working on: earlier replies lose their `<think>`."""
    if not messages:
        raise TokenizerError("apply_chat_template: the message list is empty")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content") or "", str):
            raise TokenizerError(f"apply_chat_template: message {index} needs a 'content' string")
    last_query = index_of_last_user_query(messages)
    pieces = []
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content") or ""
        if role in ("system", "user"):
            pieces.append(f"{IM_START}{role}\n{content}{IM_END}\n")
            continue
        if role != "assistant":
            raise TokenizerError(f"apply_chat_template: message {index} has role {role!r}, not system/user/assistant")
        reasoning = message.get("reasoning_content")  # apart, as chat APIs return it, or inline in the content
        if not isinstance(reasoning, str):
            reasoning = ""
            if THINK_CLOSE in content:  # split as the official template splits it
                reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
                content = content.split(THINK_CLOSE)[-1].lstrip("\n")
        if index > last_query and (index == len(messages) - 1 or reasoning):
            reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
            content = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{content}"
        pieces.append(f"{IM_START}assistant\n{content}{IM_END}\n")
    if add_generation_prompt:  # thinking off by default: the released drafters were trained without thinking traces
        pieces.append(f"{IM_START}assistant\n" + ("" if enable_thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"))
    return "".join(pieces)


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, stop tokens and the chat template."""

    apply_chat_template = staticmethod(apply_qwen3_chat_template)

    def __init__(self, raw: RawTokenizer, stop_token_ids: Iterable[int]):
        self.raw = raw
        self.token_to_id = raw.token_to_id  # a token written out -> its id, or None when the vocabulary lacks it
        self.stop_token_ids = tuple(stop_token_ids)
        self.mask_token_id = raw.token_to_id(MASK)  # what the drafter fills the slots it has not guessed with
        # A chat model's vocabulary has the turn markers; a raw code model's does not: its prompts stay plain text.
        self.has_chat_template = raw.token_to_id(IM_START) is not None and raw.token_to_id(IM_END) is not None
        self.special_ids = frozenset(raw.get_added_tokens_decoder())  # <|endoftext|>, <|im_start|>...
        self.vocab_size = raw.get_vocab_size(with_added_tokens=True)  # the embedding table may have more rows
        self._sorted_vocab = None  # (texts, ids) of every ordinary token, sorted by text: built on the first `heal`

    def encode(self, text: str) -> list[int]:
        """Token ids, none added; special tokens written out become their ids, as the model saw its chat template."""
        try:
            text.encode("utf-8")  # the Rust tokenizer takes UTF-8 only: a lone surrogate would be a TypeError
        except UnicodeEncodeError as err:
            raise TokenizerError(f"cannot encode text that is not valid UTF-8 ({err.reason} at character "
                                 f"{err.start})") from None
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text for `ids`; keeps special tokens by default so nothing is hidden."""
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def heal(self, ids: Sequence[int]) -> tuple[list[int], list[int] | None]:
        """(the prompt without its last token, the tokens that may replace it), or (ids, None). A prompt ending
        mid-token (a trailing space, half a word) ends in a token the model rarely saw there: let it choose again."""
        ids = list(ids)
        if len(ids) < 2 or ids[-1] in self.special_ids:
            return ids, None
        choices = self.tokens_starting_with(self.raw.id_to_token(ids[-1]))
        return (ids[:-1], choices) if len(choices) > 1 else (ids, None)

    def tokens_starting_with(self, piece: str) -> list[int]:
        """Ids of every ordinary token whose text (in the vocabulary's own alphabet) starts with `piece`: byte-level
        BPE spells a byte as one character, so in the sorted vocabulary they sit together (two binary searches)."""
        if self._sorted_vocab is None:
            vocab = self.raw.get_vocab(with_added_tokens=False).items()
            self._sorted_vocab = tuple(zip(*sorted((text, i) for text, i in vocab if i not in self.special_ids)))
        texts, ids = self._sorted_vocab
        first = bisect.bisect_left(texts, piece)
        last = bisect.bisect_left(texts, piece + "\U0010ffff")  # just past every extension of `piece`
        return sorted(ids[first:last])

    def encode_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                    enable_thinking: bool = False) -> list[int]:
        """Token ids of the rendered conversation: the prompt a chat model is given."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, enable_thinking))


class TextStream:
    """Token ids in, one at a time; the text each adds out. Only the newest ids are decoded again (with the
    one before, for context such as a leading space), so each costs the same however long the text grows."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids = tokenizer, []
        self.shown = self.context = 0  # ids[:shown] have given their text; ids[context:] are decoded again

    def push(self, token: int) -> str:
        """The text `token` completes: '' while it ends inside a multi-byte character."""
        self.ids.append(token)
        known, text = (self.tokenizer.decode(self.ids[self.context:end], skip_special_tokens=True)
                       for end in (self.shown, len(self.ids)))
        if text.endswith("\ufffd"):  # an unfinished character: wait for the rest
            return ""
        self.context, self.shown = self.shown, len(self.ids)
        return text[len(known):]


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer and stop tokens a checkpoint folder describes; a TokenizerError names the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TokenizerError(f"{folder}: not a folder (expected a checkpoint folder with tokenizer.json)")
    for name, decompress in TOKENIZER_FILES.items():
        path = folder / name
        check_regular_file(path, TokenizerError, "tokenizer file")  # a FIFO would never end
        if path.is_file():
            try:
                raw = RawTokenizer.from_str(decompress(path.read_bytes()).decode("utf-8"))
            except Exception as error:  # corrupt archive, bad JSON, unknown model type...
                raise TokenizerError(f"{path}: cannot read tokenizer ({error})") from error
            return Tokenizer(raw, find_stop_token_ids(folder, raw))
    raise TokenizerError(f"{folder}: no tokenizer file (looked for {', '.join(TOKENIZER_FILES)})")


def find_tokenizer(folder: str | Path, required: bool = False) -> Tokenizer | None:
    """The folder's tokenizer, or None when it has none and none is `required` (fine for token-id prompts)."""
    if not required and not any((Path(folder) / name).exists() for name in TOKENIZER_FILES):
        return None  # one that exists but is no regular file: `load_tokenizer` says so
    return load_tokenizer(folder)


def stop_token_ids(folder: str | Path, tokenizer: Tokenizer | None) -> list[int]:
    """Ids that end a reply: the tokenizer's, or without one those `generation_config.json` lists."""
    return list(tokenizer.stop_token_ids if tokenizer is not None else find_stop_token_ids(folder, None))


class Printer:
    """Streams committed tokens as text (as ids without a tokenizer); on a terminal, accepted drafts are green."""

    def __init__(self, tokenizer, colour: bool, out=None):
        self.text = TextStream(tokenizer) if tokenizer is not None else None
        self.colour, self.out = colour, out or sys.stdout

    def __call__(self, token: int, drafted: bool) -> None:
        piece = self.text.push(token) if self.text is not None else f"{token} "
        self.out.write(f"\033[32m{piece}\033[0m" if self.colour and drafted and piece else piece)
        self.out.flush()
