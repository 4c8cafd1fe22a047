"""The evaluation renders its prompts as the training data was made: thinking on or off, read from
make_data.py's settings (a JSONL file's records, a packed folder's manifest)."""

import json

import torch

import generate
from dflash.data import MANIFEST, made_with_thinking
from dflash.drafter import Drafter
from dflash.evaluation import held_out
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer
from dflash.training import Distributed

torch.set_num_threads(1)
WEIGHTS = generate.WEIGHTS


def test_the_data_says_whether_thinking_was_on(tmp_path):
    record = {"index": 0, "input_ids": [1, 2], "loss_mask": [0, 1]}
    for thinking in (True, False):
        path = tmp_path / f"data_{thinking}.jsonl"
        path.write_text(json.dumps({**record, "settings": {"thinking": thinking}}) + "\n")
        assert made_with_thinking(path) is thinking
    unsaid = tmp_path / "unsaid.jsonl"
    unsaid.write_text(json.dumps(record) + "\n")
    assert made_with_thinking(unsaid) is False
    folder = tmp_path / "packed"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"settings": {"thinking": True}}))
    assert made_with_thinking(folder) is True
    assert made_with_thinking(tmp_path / "missing.jsonl") is False


@torch.no_grad()
def test_held_out_prompts_follow_the_thinking_setting(tmp_path):
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    tokenizer = find_tokenizer(WEIGHTS / "tiny-qwen3")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Mia has 14 apples. She buys 9 more."}) + "\n")
    rendered = {}
    for thinking in (False, True):
        (continuation,) = held_out(prompts, target, drafter, tokenizer, stop_ids=[],
                                   max_new_tokens=4, token_healing=True, place=Distributed(),
                                   thinking=thinking)
        rendered[thinking] = continuation.ids[:continuation.prompt_length]
        messages = [{"role": "user", "content": "Mia has 14 apples. She buys 9 more."}]
        assert rendered[thinking] == tokenizer.encode_chat(messages, enable_thinking=thinking)
    assert rendered[False] != rendered[True]
