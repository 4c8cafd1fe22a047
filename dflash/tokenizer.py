"""Text in, token ids out, and the Qwen3 chat template written by hand.

The `tokenizers` library does the byte-level BPE of a checkpoint's `tokenizer.json`;
this file adds what a decoding loop needs around it: loading (also compressed, so a
test fixture holds Qwen3's 11 MB vocabulary in 1.4 MB), stop tokens, token healing, and
the chat template, shipped as Jinja, here in plain Python to read and test line by line.
"""

from __future__ import annotations

import bisect
import gzip
import lzma
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tokenizers import Tokenizer as RawTokenizer

from dflash.checkpoint import read_json

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
MASK = "<|mask|>"  # only in this project's demo tokenizer: the drafter's "blank" token
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Turns Qwen3's reasoning off: our default, as the released drafters were trained without thinking traces.
EMPTY_THINKING = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


class TokenizerError(ValueError):
    """A tokenizer, or a conversation, this code cannot handle. The message is one line a CLI can print."""


# --------------------------------------------------------------------------- loading

TOKENIZER_FILES = {  # tried in this order: the plain file wins when a folder has several
    "tokenizer.json": lambda path: path.read_text(encoding="utf-8"),
    "tokenizer.json.xz": lambda path: lzma.decompress(path.read_bytes()).decode("utf-8"),
    "tokenizer.json.gz": lambda path: gzip.decompress(path.read_bytes()).decode("utf-8"),
}


def load_raw_tokenizer(folder: Path) -> RawTokenizer:
    """Read the first tokenizer file the folder has, plain or compressed."""
    if not folder.is_dir():
        raise TokenizerError(f"{folder}: not a folder (expected a checkpoint folder with tokenizer.json)")
    for name, read_text in TOKENIZER_FILES.items():
        path = folder / name
        if path.is_file():
            try:
                return RawTokenizer.from_str(read_text(path))
            except Exception as error:  # corrupt archive, bad JSON, unknown model type...
                raise TokenizerError(f"{path}: cannot read tokenizer ({error})") from error
    raise TokenizerError(f"{folder}: no tokenizer file (looked for {', '.join(TOKENIZER_FILES)})")


def config_file(path: Path) -> dict:
    """A config file's contents, or {} when the folder does not have it."""
    return read_json(path, TokenizerError) if path.is_file() else {}


# --------------------------------------------------------------------------- stop tokens


def find_stop_token_ids(folder: Path, raw: RawTokenizer | None) -> tuple[int, ...]:
    """Every id that ends a reply, in the order the configs name them, without repeats.

    Qwen3 chat models need both files: `generation_config.json` usually lists `<|endoftext|>`,
    while a chat turn ends with `tokenizer_config.json`'s `eos_token`, `<|im_end|>`. Without
    either, those two tokens; without a tokenizer (`raw` None), the listed ids alone.
    """
    folder = Path(folder)
    eos_ids = config_file(folder / "generation_config.json").get("eos_token_id")  # an int or a list
    stop_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids) if isinstance(eos_ids, list) else []
    if raw is None:
        return tuple(dict.fromkeys(stop_ids))
    eos_token = config_file(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")  # how older files write it
    if isinstance(eos_token, str):
        eos_id = raw.token_to_id(eos_token)
        if eos_id is None:
            raise TokenizerError(f"{folder / 'tokenizer_config.json'}: eos_token {eos_token!r} is not in the vocab")
        stop_ids.append(eos_id)
    if not stop_ids:
        stop_ids = [i for i in (raw.token_to_id(IM_END), raw.token_to_id(END_OF_TEXT)) if i is not None]
    return tuple(dict.fromkeys(stop_ids))  # dict keys: a union that keeps the order


# --------------------------------------------------------------------------- chat template


def split_thinking(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant reply, as the official template splits it.

    The reasoning lies between `<think>` and the first `</think>`, the answer after the
    last `</think>`, each without the newlines next to the tags; no `</think>`: no reasoning.
    """
    if THINK_CLOSE not in content:
        return "", content
    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    answer = content.split(THINK_CLOSE)[-1].lstrip("\n")
    return reasoning, answer


def index_of_last_user_query(messages: Sequence[Mapping[str, str]]) -> int:
    """Where the latest real user question sits (not a wrapped tool result); replies after it keep their reasoning.

    Without one the official template uses the last index, so that no reply counts as "after" it.
    """
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content") or ""
        is_tool_result = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        if messages[index]["role"] == "user" and not is_tool_result:
            return index
    return len(messages) - 1


def render_assistant_turn(reasoning: str, answer: str, keep_thinking_block: bool) -> str:
    """One assistant turn, with or without its `<think>` block.

    Qwen3 was trained to see reasoning only in the turn it is working on: earlier replies lose theirs.
    """
    if keep_thinking_block:
        reasoning, answer = reasoning.strip("\n"), answer.lstrip("\n")
        body = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{answer}"
    else:
        body = answer
    return f"{IM_START}assistant\n{body}{IM_END}\n"


def apply_qwen3_chat_template(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                              enable_thinking: bool = False) -> str:
    """The text Qwen3's official chat template renders (without tools).

    Each turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`. Assistant turns after the
    last user question keep a `<think>` block when final or holding reasoning. The
    generation prompt opens an assistant turn; with thinking off it also writes an
    empty `<think>` block, so the model answers straight away.
    """
    if not messages:
        raise TokenizerError("apply_chat_template: the message list is empty")
    for position, message in enumerate(messages):
        if message.get("role") not in ("system", "user", "assistant"):
            raise TokenizerError(f"apply_chat_template: message {position} has role {message.get('role')!r}; "
                                 "expected 'system', 'user' or 'assistant'")
    last_query = index_of_last_user_query(messages)
    pieces = []
    for index, message in enumerate(messages):
        role, content = message["role"], message.get("content") or ""
        if role in ("system", "user"):
            pieces.append(f"{IM_START}{role}\n{content}{IM_END}\n")
            continue
        reasoning = message.get("reasoning_content")  # apart, as chat APIs return it, or inline in the content
        reasoning, answer = (reasoning, content) if isinstance(reasoning, str) else split_thinking(content)
        is_last = index == len(messages) - 1
        keep_thinking_block = index > last_query and (is_last or bool(reasoning))
        pieces.append(render_assistant_turn(reasoning, answer, keep_thinking_block))

    if add_generation_prompt:
        pieces.append(f"{IM_START}assistant\n")
        if not enable_thinking:
            pieces.append(EMPTY_THINKING)
    return "".join(pieces)


# --------------------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, stop tokens and the chat template."""

    def __init__(self, raw: RawTokenizer, stop_token_ids: Iterable[int]):
        self.raw = raw
        self.stop_token_ids = tuple(stop_token_ids)
        self.mask_token_id = raw.token_to_id(MASK)  # what the drafter fills the slots it has not guessed with
        # A chat model's vocabulary has the turn markers; a raw code model's does not: its prompts stay plain text.
        self.has_chat_template = raw.token_to_id(IM_START) is not None and raw.token_to_id(IM_END) is not None
        self.special_ids = frozenset(raw.get_added_tokens_decoder())  # <|endoftext|>, <|im_start|>...
        self._sorted_texts: list[str] | None = None  # every ordinary token's text, sorted: built on the first `heal`
        self._sorted_ids: list[int] = []  # their ids, in the same order

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce, added tokens included; the embedding table is often larger (151936)."""
        return self.raw.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids for `text`, adding nothing of our own.

        Special tokens written in the text (`<|im_start|>`, `<think>`...) become their single
        ids: that is how a rendered chat template becomes the ids the model was trained on.
        """
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text for `ids`; keeps special tokens by default so nothing is hidden."""
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def heal(self, ids: Sequence[int]) -> tuple[list[int], list[int] | None]:
        """Token healing: (the prompt without its last token, the tokens that may replace it), or (ids, None).

        A prompt ending mid-token (a newline before indentation, a trailing space, half a
        word) ends in a token the model rarely saw there: in training text the newline came
        merged with the indentation. So drop it, and let the first new token be any token
        that starts with its text. Nothing changes for a special token or when none extends it.
        """
        ids = list(ids)
        if len(ids) < 2 or ids[-1] in self.special_ids:
            return ids, None
        choices = self.tokens_starting_with(self.raw.id_to_token(ids[-1]))
        return (ids[:-1], choices) if len(choices) > 1 else (ids, None)

    def tokens_starting_with(self, piece: str) -> list[int]:
        """Ids of every ordinary token whose text (in the vocabulary's own alphabet) starts with `piece`.

        Byte-level BPE spells each byte as one character, so a string prefix is a byte
        prefix; sorted, the tokens sharing a prefix sit together: two binary searches.
        """
        if self._sorted_texts is None:  # once per tokenizer: 150,000 strings for Qwen3
            ordinary = sorted((text, i) for text, i in self.raw.get_vocab(with_added_tokens=False).items()
                              if i not in self.special_ids)
            self._sorted_texts, self._sorted_ids = [text for text, _ in ordinary], [i for _, i in ordinary]
        first = bisect.bisect_left(self._sorted_texts, piece)
        last = bisect.bisect_left(self._sorted_texts, piece + "\U0010ffff")  # just past every extension of `piece`
        return sorted(self._sorted_ids[first:last])

    def token_to_id(self, token: str) -> int | None:
        """The id of one token written out, or None when the vocabulary lacks it."""
        return self.raw.token_to_id(token)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                            enable_thinking: bool = False) -> str:
        """The conversation as Qwen3 expects to read it (see `apply_qwen3_chat_template`)."""
        return apply_qwen3_chat_template(messages, add_generation_prompt, enable_thinking)

    def encode_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                    enable_thinking: bool = False) -> list[int]:
        """Token ids of the rendered conversation: the prompt a chat model is given."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, enable_thinking))


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer and stop tokens a checkpoint folder describes; a TokenizerError names the file."""
    folder = Path(folder)
    raw = load_raw_tokenizer(folder)
    return Tokenizer(raw, find_stop_token_ids(folder, raw))


def find_tokenizer(folder: str | Path, required: bool = False) -> Tokenizer | None:
    """The folder's tokenizer, or None when it has none and none is `required` (fine for token-id prompts)."""
    if not required and not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        return None
    return load_tokenizer(folder)


def stop_token_ids(folder: str | Path, tokenizer: Tokenizer | None) -> list[int]:
    """Ids that end a reply: the tokenizer's, or without one those `generation_config.json` lists."""
    return list(tokenizer.stop_token_ids if tokenizer is not None else find_stop_token_ids(folder, None))
