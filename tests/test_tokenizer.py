"""The tokenizer against Qwen3's real vocabulary, and the chat template against
the text Qwen3's official Jinja template renders.

The expected ids below were produced by Qwen3's own tokenizer; the expected chat
strings are written out literally, character by character, as the official
template renders them, so a change in any rule shows up as a plain text diff.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers

from dflash.tokenizer import (Tokenizer, TokenizerError, find_stop_token_ids, find_tokenizer, load_tokenizer,
                              stop_token_ids)

QWEN3_FOLDER = Path(__file__).parent / "fixtures" / "qwen3-tokenizer"

IM_START, IM_END, END_OF_TEXT = 151644, 151645, 151643
THINK_OPEN, THINK_CLOSE, DOUBLE_NEWLINE = 151667, 151668, 271

SYSTEM_USER_PREFIX = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nAudio 1: "
)
SYSTEM_USER_PREFIX_IDS = [
    151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198,
    151644, 872, 198, 14755, 220, 16, 25, 220,
]  # fmt: skip


@pytest.fixture(scope="module")
def qwen3() -> Tokenizer:
    """Decompressing and parsing 11 MB of vocabulary takes a second: do it once."""
    return load_tokenizer(QWEN3_FOLDER)


# --------------------------------------------------------------------------- encode / decode


def test_encode_matches_qwen3_ids(qwen3):
    assert qwen3.encode("Hello world") == [9707, 1879]


def test_special_tokens_written_in_text_become_single_ids(qwen3):
    assert qwen3.encode("<think>\n\n</think>\n\n") == [THINK_OPEN, DOUBLE_NEWLINE, THINK_CLOSE, DOUBLE_NEWLINE]
    assert qwen3.encode(SYSTEM_USER_PREFIX) == SYSTEM_USER_PREFIX_IDS


def test_encode_adds_no_tokens_of_its_own(qwen3):
    assert qwen3.encode("") == []
    assert qwen3.encode("Hello")[0] != IM_START


@pytest.mark.parametrize(
    "text",
    [
        "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
        "Grüße, 世界! 🚀  double  spaces\ttabs",
        SYSTEM_USER_PREFIX + "<|im_end|>\n",
    ],
)
def test_decode_round_trips(qwen3, text):
    assert qwen3.decode(qwen3.encode(text)) == text


def test_decode_can_skip_special_tokens(qwen3):
    ids = qwen3.encode("<|im_start|>user\nHi<|im_end|>")
    assert qwen3.decode(ids) == "<|im_start|>user\nHi<|im_end|>"
    assert qwen3.decode(ids, skip_special_tokens=True) == "user\nHi"


def test_vocabulary_facts(qwen3):
    assert qwen3.vocab_size == 151669  # 151643 BPE tokens + 26 added tokens
    assert qwen3.token_to_id("<|im_end|>") == IM_END
    assert qwen3.token_to_id("<|endoftext|>") == END_OF_TEXT
    assert qwen3.token_to_id("<|no such token|>") is None
    assert qwen3.mask_token_id is None  # Qwen3 has no <|mask|>; our demo tokenizer does
    assert qwen3.has_chat_template


# --------------------------------------------------------------------------- stop tokens


def test_stop_tokens_come_from_tokenizer_config(qwen3):
    assert qwen3.stop_token_ids == (IM_END,)  # eos_token "<|im_end|>"


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def test_stop_tokens_are_the_union_of_both_config_files(qwen3, tmp_path):
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [END_OF_TEXT, 42, IM_END]})
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|im_end|>"})
    assert find_stop_token_ids(tmp_path, qwen3.raw) == (END_OF_TEXT, 42, IM_END)


def test_stop_token_id_may_be_a_single_int(qwen3, tmp_path):
    write_json(tmp_path / "generation_config.json", {"eos_token_id": END_OF_TEXT})
    assert find_stop_token_ids(tmp_path, qwen3.raw) == (END_OF_TEXT,)


def test_stop_tokens_fall_back_to_chat_and_document_ends(qwen3, tmp_path):
    assert find_stop_token_ids(tmp_path, qwen3.raw) == (IM_END, END_OF_TEXT)


def test_unknown_eos_token_is_an_error(qwen3, tmp_path):
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|not a token|>"})
    with pytest.raises(TokenizerError, match="not a token"):
        find_stop_token_ids(tmp_path, qwen3.raw)


def test_without_a_tokenizer_the_stop_tokens_are_generation_configs_ids(tmp_path):
    """Token-id prompts need no tokenizer: the stop ids then come from generation_config.json alone."""
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [END_OF_TEXT, IM_END]})
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<|im_end|>"})  # a name, and no vocabulary to look it up
    assert find_tokenizer(tmp_path) is None
    assert stop_token_ids(tmp_path, None) == [END_OF_TEXT, IM_END]
    write_json(tmp_path / "generation_config.json", {"eos_token_id": 7})
    assert stop_token_ids(tmp_path, None) == [7]
    (tmp_path / "generation_config.json").unlink()
    assert stop_token_ids(tmp_path, None) == []


def test_a_config_that_is_not_json_is_one_line_naming_the_file(qwen3, tmp_path):
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"generation_config\.json: not valid JSON") as caught:
        find_stop_token_ids(tmp_path, qwen3.raw)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- loading


def save_demo_tokenizer(folder: Path) -> str:
    """A six-word tokenizer with the two special tokens this project's demo models use."""
    words = ["the", "cat", "sat", "on", "mat", "[UNK]"]
    raw = RawTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["<|endoftext|>", "<|mask|>"])
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    return raw.to_str()


def test_demo_tokenizer_exposes_mask_and_falls_back_to_endoftext(tmp_path):
    save_demo_tokenizer(tmp_path)
    demo = load_tokenizer(tmp_path)
    assert demo.mask_token_id == 7
    assert demo.stop_token_ids == (6,)  # no config files, no <|im_end|>: <|endoftext|> alone
    assert not demo.has_chat_template  # no <|im_start|>/<|im_end|>: prompts stay plain text
    assert demo.encode("the cat sat<|mask|>") == [0, 1, 2, 7]


def test_gzip_copy_loads_like_the_plain_file(tmp_path):
    text = save_demo_tokenizer(tmp_path / "plain")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "tokenizer.json.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    plain, packed = load_tokenizer(tmp_path / "plain"), load_tokenizer(tmp_path / "packed")
    assert packed.encode("the mat sat on the cat") == plain.encode("the mat sat on the cat") == [0, 4, 2, 3, 0, 1]


def test_folder_without_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer file") as caught:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(caught.value)
    assert "\n" not in str(caught.value)  # one line a CLI can print


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="not a folder"):
        load_tokenizer(tmp_path / "missing")


def test_corrupt_tokenizer_file_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json.xz").write_bytes(b"definitely not xz")
    with pytest.raises(TokenizerError, match="tokenizer.json.xz"):
        load_tokenizer(tmp_path)


# --------------------------------------------------------------------------- chat template


def test_single_user_turn_thinking_off_writes_an_empty_think_block(qwen3):
    text = qwen3.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_single_user_turn_thinking_on_leaves_the_reply_open(qwen3):
    text = qwen3.apply_chat_template([{"role": "user", "content": "Hello"}], enable_thinking=True)
    assert text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


def test_system_prompt_comes_first(qwen3):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi"},
    ]
    assert qwen3.apply_chat_template(messages) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_earlier_assistant_turns_lose_their_reasoning(qwen3):
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert qwen3.apply_chat_template(messages) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_assistant_turns_after_the_last_question_keep_reasoning(qwen3):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nA1"},
        {"role": "assistant", "content": "A2"},  # the last message always gets a think block
    ]
    assert qwen3.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nfirst\n</think>\n\nA1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n"
    )


def test_middle_assistant_turn_without_reasoning_stays_plain(qwen3):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A1"},
        {"role": "assistant", "content": "A2"},
    ]
    assert qwen3.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n"
    )


def test_chat_ids_are_the_ids_of_the_rendered_turns(qwen3):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Audio 1: "},
    ]
    close_user_open_assistant = [IM_END, 198, IM_START, 77091, 198]  # 198 "\n", 77091 "assistant"
    empty_thinking = [THINK_OPEN, DOUBLE_NEWLINE, THINK_CLOSE, DOUBLE_NEWLINE]
    assert qwen3.encode_chat(messages) == SYSTEM_USER_PREFIX_IDS + close_user_open_assistant + empty_thinking
    assert qwen3.encode_chat(messages, enable_thinking=True) == SYSTEM_USER_PREFIX_IDS + close_user_open_assistant


def test_empty_conversation_is_rejected(qwen3):
    with pytest.raises(ValueError, match="empty"):
        qwen3.apply_chat_template([])


def test_unknown_role_is_rejected(qwen3):
    with pytest.raises(ValueError, match="'narrator'"):
        qwen3.apply_chat_template([{"role": "narrator", "content": "Once upon a time"}])
