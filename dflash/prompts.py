"""Prompt files and how a prompt becomes token ids, alike in every program: a drafter trained on prompts rendered
one way meets at inference whatever the programs render, so all go through `encode_for_generation`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dflash.checkpoint import check_memory, is_integer
from dflash.cli import jsonl_records
from dflash.errors import UsageError
from dflash.tokenizer import Tokenizer


PROMPT_FORMAT = """\
prompt files are JSONL: one object per line, with exactly one of
  {"prompt": "text"}                                  raw text
  {"messages": [{"role": "user", "content": "..."}]}  a conversation, rendered by the chat template
  {"prompt_ids": [1, 2, 3]}                           token ids (no tokenizer needed)
and optionally "answer", the expected final answer (bench.py checks it); other fields are ignored"""

# A prompt file's field: (the Prompt attribute it fills, the type of its value, a test of its items
# and their name). JSON's true is an int to Python, but no token id.
PROMPT_FIELDS = {"prompt": ("text", str, lambda x: isinstance(x, str), "str"),
                 "messages": ("messages", list, lambda x: isinstance(x, dict), "dict"),
                 "prompt_ids": ("ids", list, is_integer, "int")}


@dataclass
class Prompt:
    """One prompt: exactly one of text, messages or ids is set."""

    where: str  # "file:line", for error messages
    text: str | None = None
    messages: list[dict] | None = None
    ids: list[int] | None = None
    answer: str | None = None  # the expected final answer, when the file gives one (benchmarks check it)

    def __post_init__(self):
        """Refuse, naming `where`, what the tokenizer or the chat template could only fail on later."""
        if self.text is not None:
            check_text(self.text, self.where)
            if not self.text.strip():
                raise UsageError(f"{self.where}: the prompt is empty (or only whitespace)")
        for index, message in enumerate(self.messages or []):
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise UsageError(f"{self.where}: message {index} needs a 'role' of {', '.join(ROLES)}")
            if not isinstance(message.get("content"), str):
                raise UsageError(f"{self.where}: message {index} needs a 'content' string")
            check_text(message["content"], f"{self.where}: message {index}")
        if self.messages is not None and not any(m["role"] == "user" for m in self.messages):
            raise UsageError(f"{self.where}: the conversation has no user turn (a 'role' of "
                             "'user'): nothing to answer")


ROLES = ("system", "user", "assistant")  # what the chat template renders (`apply_qwen3_chat_template`)


def check_text(text: str, where: str) -> None:
    """Text a tokenizer can encode: a lone surrogate (a JSON "\\ud800", or bytes that are not UTF-8 on a command
    line, which Python keeps as surrogates) cannot be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UsageError(f"{where}: the text is not valid UTF-8 ({err.reason} at character {err.start})") from None


def parse_prompt(record, where: str) -> Prompt:
    """One line of a prompt file, checked against PROMPT_FORMAT."""
    given = [field for field in PROMPT_FIELDS if field in record] if isinstance(record, dict) else []
    if len(given) != 1:
        raise UsageError(f"{where}: expected an object with exactly one of 'prompt', 'messages' or 'prompt_ids'")
    attribute, kind, item, item_name = PROMPT_FIELDS[given[0]]
    value, answer = record[given[0]], record.get("answer")
    if not (value and isinstance(value, kind) and all(map(item, value))):
        of_items = "" if kind is str else f" of {item_name}"
        raise UsageError(f"{where}: '{given[0]}' must be a non-empty {kind.__name__}{of_items}")
    return Prompt(where, **{attribute: value}, answer=None if answer is None else str(answer))


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt of a prompt file, in order."""
    prompts = [parse_prompt(record, where) for where, record in jsonl_records(path, "prompts file")]
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """How text prompts are rendered, the same options in every program."""
    either = parser.add_mutually_exclusive_group()  # the last one winning would hide a mistake
    either.add_argument("--chat", action="store_true", default=None,
                        help="wrap text prompts in the chat template (default: when the tokenizer has one)")
    either.add_argument("--raw", dest="chat", action="store_false", help="feed text prompts as they are")
    parser.add_argument("--thinking", action="store_true", help="render chat prompts with thinking on")
    parser.add_argument("--no-token-healing", dest="token_healing", action="store_false",
                        help="keep a raw prompt's last token even when it ends mid-token (a trailing newline or space)")


def check_prompt_options(args, ids_given: bool = False) -> None:
    """Refuse prompt options that would be ignored: --thinking renders a chat template, which
    --raw turns off and token ids (`ids_given`) never go through."""
    if args.thinking and args.chat is False:
        raise UsageError("--thinking renders chat prompts, which --raw turns off: give one of them")
    for option, given in (("--thinking", args.thinking), ("--chat", args.chat),
                          ("--raw", args.chat is False)):
        if ids_given and given:
            raise UsageError(f"{option} renders text prompts; token ids are fed as they are")


def encode_for_generation(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                          thinking: bool = False, token_healing: bool = True) -> tuple[list[int], list[int] | None]:
    """A prompt's ids, and the first new token's choices when token healing applies (`Tokenizer.heal`), else None.
    Text goes through the chat template when `chat` (default: when the tokenizer has one); only raw text is healed."""
    if prompt.ids is not None:
        return list(prompt.ids), None
    if tokenizer is None:
        raise UsageError(f"{prompt.where}: text prompts need a tokenizer, and the checkpoint folder has none")
    messages = prompt.messages
    if messages is None and (tokenizer.has_chat_template if chat is None else chat):
        messages = [{"role": "user", "content": prompt.text}]
    while messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # a dataset's own answer: the target writes its own
    ids = (tokenizer.encode(prompt.text) if messages is None
           else tokenizer.encode_chat(messages, enable_thinking=thinking))
    if not ids:
        raise UsageError(f"{prompt.where}: the prompt is empty")
    return tokenizer.heal(ids) if token_healing and messages is None else (ids, None)


def encode_prompt(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool | None = None,
                  thinking: bool = False) -> list[int]:
    """A prompt's token ids, never healed (see `encode_for_generation`)."""
    return encode_for_generation(prompt, tokenizer, chat, thinking, token_healing=False)[0]


# ------------------------------------------------------- what the models can serve


def check_request(target, drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                  block_size: int, tree_budget: int = 0, where: str = "prompt") -> None:
    """Refuse, in one line naming the problem, what a Qwen3 `target` and its drafter (or None) cannot serve: the
    door of a request, before any cache is allocated (the memory is probed here, once), by the programs for every
    prompt at once and by a loop building its own runner."""
    target.check_request(prompt_ids, max_new_tokens, where)  # what every loop call checks too
    n, limit = len(prompt_ids), target.config.max_position_embeddings
    if drafter is None:
        return
    if not 2 <= block_size <= drafter.config.block_size:
        raise UsageError(f"block size must be in 2..{drafter.config.block_size} (the drafter's), got {block_size}")
    if tree_budget + 1 > limit - n:  # its nodes take cache slots after the prompt; its mask is (nodes + 1)^2
        raise UsageError(f"a tree of {tree_budget} nodes does not fit after the prompt's {n} tokens in the model's "
                         f"max_position_embeddings ({limit})")
    check_request_memory(target, drafter, n, max_new_tokens, max(block_size, tree_budget + 1),
                         where)


def check_request_memory(target, drafter, n: int, max_new_tokens: int, block: int,
                         where: str) -> None:
    """Refuse a request whose caches and widest pass would not fit in the device's memory: the
    runner allocates a cache slot per position (the prompt's, the new tokens', a last block or tree
    that may reach past them), and a pass of `chunk` rows holds attention scores against every slot
    and logits over the vocabulary. Against all of the memory, not what is free: once the runner has
    its caches they are no longer free, and the loops check each request again."""
    weight, config = target.embed_tokens.weight, target.config
    slots = n + max_new_tokens + block
    chunk = max(n, 2 * block)  # the prefill's, or a draft's: a block of context and the block
    per_slot = cache_elements_per_slot(config)
    per_slot += cache_elements_per_slot(drafter.config.layers) if drafter is not None else 0
    scores = config.num_attention_heads * chunk * (slots + block) * 4  # float32
    logits = chunk * config.vocab_size * (4 + 8 + 8)  # float32 logits; float64 probabilities, sums
    need = (slots + block) * per_slot * weight.element_size() + scores + logits
    check_memory(need, weight.device, f"{where}: the {slots} cache slots (the prompt's {n} "
                 f"tokens, max_new_tokens {max_new_tokens}, a block or tree of {block}) and a pass "
                 "over them", UsageError, in_all=True)


def cache_elements_per_slot(config) -> int:
    """Elements one position takes in a `KVCache` of a Qwen3 stack shaped by `config`: a key and a
    value per layer."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim


def check_no_mask_token(drafter, prompt_ids: Sequence[int], where: str) -> None:
    """A user's prompt holding the drafter's mask token is a mistake (the token marks the slots not yet guessed and
    is no text's); the loops themselves run on any ids, as tests' random prompts need."""
    if drafter is not None and drafter.config.mask_token_id in prompt_ids:
        raise UsageError(f"{where}: token id {drafter.config.mask_token_id} is the drafter's mask token, not a token "
                         "a prompt may hold")
