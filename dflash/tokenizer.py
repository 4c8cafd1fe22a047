"""Text in, token ids out, and the Qwen3 chat template written by hand.

A Qwen3 checkpoint folder carries its tokenizer as `tokenizer.json`, the file
format of the Hugging Face `tokenizers` library. That library does the real
work here (byte-level BPE plus the "added tokens" such as `<|im_start|>`); this
file adds the three things a decoding loop needs around it:

1. **Loading**: from `tokenizer.json`, or from a compressed copy
   (`tokenizer.json.xz` / `.gz`) so a test fixture can hold Qwen3's 11 MB
   vocabulary in about 1.4 MB.
2. **Stop tokens**: which ids end a reply. Qwen3 ends a chat turn with
   `<|im_end|>` and a document with `<|endoftext|>`; the folder's config files
   say which ones count.
3. **The chat template**: the exact text Qwen3 was trained to see around a
   conversation. Official checkpoints ship it as a Jinja program; we write the
   same rules out in plain Python so they can be read (and tested) line by line.

Reading order: errors, loading the raw tokenizer, finding stop tokens, the chat
template, and finally the `Tokenizer` class that ties them together.
"""

from __future__ import annotations

import bisect
import gzip
import json
import lzma
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tokenizers import Tokenizer as RawTokenizer

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
MASK = "<|mask|>"  # only in this project's demo tokenizer: the drafter's "blank" token
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# The empty thinking block that turns Qwen3's reasoning off. The released DFlash
# drafters were trained on replies without thinking traces, so OFF is our default.
EMPTY_THINKING = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


class TokenizerError(ValueError):
    """A tokenizer, or a conversation, this code cannot handle. The message is one line a CLI can print."""


# --------------------------------------------------------------------------- loading

# Tried in this order; the plain file wins when a folder has several.
TOKENIZER_FILES = {
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


def read_json_if_present(path: Path) -> dict:
    """A config file's contents, or {} when the folder does not have it."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise TokenizerError(f"{path}: not valid JSON ({error})") from error


# --------------------------------------------------------------------------- stop tokens


def eos_ids_of_generation_config(folder: Path) -> list[int]:
    """The ids `generation_config.json` lists as `eos_token_id` (an int or a list); [] without one.

    The one place this file is read: a folder without a tokenizer (token-id prompts)
    still knows its stop tokens from here.
    """
    eos_ids = read_json_if_present(Path(folder) / "generation_config.json").get("eos_token_id")
    if isinstance(eos_ids, int):
        return [eos_ids]
    if isinstance(eos_ids, list):
        return [int(i) for i in eos_ids]
    return []


def find_stop_token_ids(folder: Path, raw: RawTokenizer) -> tuple[int, ...]:
    """Every id that ends a reply, gathered from the two places checkpoints put it.

    `generation_config.json` lists ids (`eos_token_id`: an int or a list);
    `tokenizer_config.json` names one token (`eos_token`: a string, or in older
    files a dict with its "content"). Qwen3 chat models need both, because the
    first usually says `<|endoftext|>` while a chat turn really ends with
    `<|im_end|>`. A folder with neither falls back to those two tokens by name.
    The result keeps the order the files name them in, without repeats.
    """
    stop_ids = eos_ids_of_generation_config(folder)

    eos_token = read_json_if_present(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    if isinstance(eos_token, str):
        eos_id = raw.token_to_id(eos_token)
        if eos_id is None:
            raise TokenizerError(f"{folder / 'tokenizer_config.json'}: eos_token {eos_token!r} is not in the vocabulary")
        stop_ids.append(eos_id)

    if not stop_ids:
        stop_ids = [i for i in (raw.token_to_id(IM_END), raw.token_to_id(END_OF_TEXT)) if i is not None]
    return tuple(dict.fromkeys(stop_ids))  # dict keys: a union that keeps the order


# --------------------------------------------------------------------------- chat template


def split_thinking(content: str) -> tuple[str, str]:
    """Split an assistant reply into (reasoning, answer) at its `</think>`.

    Mirrors the official template: the reasoning is what lies between `<think>`
    and the first `</think>`, the answer is what follows the last `</think>`,
    each with the newlines next to the tags stripped. No `</think>` means no
    reasoning and an untouched answer.
    """
    if THINK_CLOSE not in content:
        return "", content
    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    answer = content.split(THINK_CLOSE)[-1].lstrip("\n")
    return reasoning, answer


def index_of_last_user_query(messages: Sequence[Mapping[str, str]]) -> int:
    """Where the latest real user question sits; replies after it keep their reasoning.

    A user message that is only a wrapped tool result does not count as a
    question. With no user message at all the official template uses the last
    index, so that no reply counts as "after" it.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        content = message.get("content") or ""
        is_tool_result = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        if message["role"] == "user" and not is_tool_result:
            return index
    return len(messages) - 1


def reasoning_and_answer(message: Mapping[str, str]) -> tuple[str, str]:
    """An assistant message's reasoning and answer.

    A message may carry its reasoning separately (`reasoning_content`, as
    chat APIs return it) or inline as `<think>...</think>` in its content.
    """
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    return split_thinking(content)


def render_assistant_turn(reasoning: str, answer: str, keep_thinking_block: bool) -> str:
    """One assistant turn, with or without its `<think>` block.

    Qwen3 was trained to see reasoning only in the turn it is working on:
    replies to earlier questions appear with their reasoning removed, which
    also keeps long conversations short.
    """
    if keep_thinking_block:
        reasoning, answer = reasoning.strip("\n"), answer.lstrip("\n")
        body = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{answer}"
    else:
        body = answer
    return f"{IM_START}assistant\n{body}{IM_END}\n"


def apply_qwen3_chat_template(
    messages: Sequence[Mapping[str, str]],
    add_generation_prompt: bool = True,
    enable_thinking: bool = False,
) -> str:
    """The text Qwen3's official chat template renders (the case without tools).

    Each turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`. Assistant turns
    after the last user question keep a `<think>` block when they are the
    final message or actually contain reasoning; earlier ones lose it. The
    generation prompt opens an assistant turn, and with thinking off it also
    writes an empty `<think>` block so the model answers straight away.
    """
    if not messages:
        raise TokenizerError("apply_chat_template: the message list is empty")
    for position, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant"):
            raise TokenizerError(
                f"apply_chat_template: message {position} has role {role!r}; "
                "expected 'system', 'user' or 'assistant'"
            )

    last_query = index_of_last_user_query(messages)
    pieces = []
    for index, message in enumerate(messages):
        role, content = message["role"], message.get("content") or ""
        if role in ("system", "user"):
            pieces.append(f"{IM_START}{role}\n{content}{IM_END}\n")
            continue
        reasoning, answer = reasoning_and_answer(message)
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
        # The drafter fills the positions it has not guessed yet with this token.
        self.mask_token_id = raw.token_to_id(MASK)
        # A chat model's vocabulary has the turn markers; a raw code model's does not,
        # and its prompts are passed as plain text instead.
        self.has_chat_template = raw.token_to_id(IM_START) is not None and raw.token_to_id(IM_END) is not None
        self.special_ids = frozenset(raw.get_added_tokens_decoder())  # <|endoftext|>, <|im_start|>...
        self._sorted_texts: list[str] | None = None  # every ordinary token's text, sorted: built on the first `heal`
        self._sorted_ids: list[int] = []  # their ids, in the same order

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Tokenizer":
        """Load the tokenizer and stop tokens a checkpoint folder describes."""
        folder = Path(folder)
        raw = load_raw_tokenizer(folder)
        return cls(raw, find_stop_token_ids(folder, raw))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included.

        The model's embedding table is often larger (Qwen3 pads to 151936);
        the extra rows are never produced by the tokenizer.
        """
        return self.raw.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids for `text`, adding nothing of our own.

        Special tokens written in the text (`<|im_start|>`, `<think>`, ...)
        become their single ids, which is how a rendered chat template turns
        into the ids the model was trained on.
        """
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text for `ids`; keeps special tokens by default so nothing is hidden."""
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def heal(self, ids: Sequence[int]) -> tuple[list[int], list[int] | None]:
        """Token healing: (the prompt without its last token, the tokens that may replace it), or (ids, None).

        A prompt that ends in the middle of what would be one token (a bare newline
        before indentation, a trailing space, half an identifier) ends in a token the
        model rarely saw in that place: in training text the newline came merged with
        the indentation after it. So drop the last token, and let the first generated
        token be any token whose text starts with the dropped text. Nothing changes
        when no longer token starts with it, or for a special token.
        """
        ids = list(ids)
        if len(ids) < 2 or ids[-1] in self.special_ids:
            return ids, None
        choices = self.tokens_starting_with(self.raw.id_to_token(ids[-1]))
        return (ids[:-1], choices) if len(choices) > 1 else (ids, None)

    def tokens_starting_with(self, piece: str) -> list[int]:
        """Ids of every ordinary token whose text (in the vocabulary's own alphabet) starts with `piece`.

        In a byte-level BPE vocabulary every byte is one character, so a prefix of
        the string is a prefix of the bytes. Sorted strings put all tokens with one
        prefix next to each other: two binary searches find them.
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

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
    ) -> str:
        """The conversation as Qwen3 expects to read it (see `apply_qwen3_chat_template`)."""
        return apply_qwen3_chat_template(messages, add_generation_prompt, enable_thinking)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
    ) -> list[int]:
        """Token ids of the rendered conversation: the prompt a chat model is given."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, enable_thinking))


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """Load a checkpoint folder's tokenizer; raises TokenizerError naming the path."""
    return Tokenizer.from_folder(folder)
