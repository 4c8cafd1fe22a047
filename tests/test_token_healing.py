"""Token healing: a raw prompt that ends mid-token gets its last token back, chosen by the model."""

from pathlib import Path

import pytest
import torch

from dflash.drafter import Drafter
from dflash.prompts import Prompt, encode_for_generation
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from generate import generate_autoregressive, generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights"
torch.set_num_threads(1)

ENDINGS = {  # raw prompts ending in a newline, a space, and half a word (the demo's chat prompts are not healed)
    "newline": "Mia has 14 apples. She buys 9 more.\n",
    "space": "Mia has 14 apples. She buys 9 more. How many ",
    "half word": "Mia has 14 apples. She buys 9 more. How ma",
}


@pytest.fixture(scope="module")
def demo():
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
    return target, drafter, load_tokenizer(WEIGHTS / "tiny-qwen3")


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_last_token_is_dropped_and_every_choice_extends_it(demo, ending):
    _, _, tokenizer = demo
    ids = tokenizer.encode(ENDINGS[ending])
    healed, choices = tokenizer.heal(ids)
    assert healed == ids[:-1] and len(choices) > 1 and ids[-1] in choices
    dropped = tokenizer.decode(ids[-1:])
    assert all(tokenizer.decode([choice]).startswith(dropped) for choice in choices)
    assert not any(tokenizer.decode([i]).startswith(dropped) for i in range(tokenizer.vocab_size)
                   if i not in choices and i not in tokenizer.special_ids)


@pytest.mark.parametrize("ending", ENDINGS)
def test_both_loops_agree_and_restore_the_dropped_text(demo, ending):
    target, drafter, tokenizer = demo
    ids, choices = encode_for_generation(Prompt("test", text=ENDINGS[ending]), tokenizer, chat=False)
    plain = generate_autoregressive(target, ids, 32, first_token_choices=choices)
    fast = generate_dflash(target, drafter, ids, 32, first_token_choices=choices)
    assert fast.new_ids == plain.new_ids and plain.new_ids[0] in choices
    text = tokenizer.decode(ids + plain.new_ids)
    assert text.startswith(ENDINGS[ending])  # the dropped text comes back, then the continuation


def test_nothing_to_heal_keeps_the_prompt(demo):
    _, _, tokenizer = demo
    ids = tokenizer.encode("The answer is 23.")  # ends in a token no longer token starts with
    healed, choices = tokenizer.heal(ids)
    assert choices is None or healed == ids[:-1]
    assert tokenizer.heal(ids[:1]) == (ids[:1], None)  # a one-token prompt cannot lose its token


def test_only_raw_text_is_healed(demo):
    _, _, tokenizer = demo
    as_ids = encode_for_generation(Prompt("test", ids=[5, 6, 7]), tokenizer)
    assert as_ids == ([5, 6, 7], None)
    kept = encode_for_generation(Prompt("test", text="Mia has 14 apples.\n"), tokenizer, chat=False,
                                 token_healing=False)
    assert kept[1] is None and kept[0] == tokenizer.encode("Mia has 14 apples.\n")
    chat = encode_for_generation(Prompt("test", text="Mia has 14 apples.\n"), tokenizer)  # the demo is a chat model
    assert chat[1] is None and chat[0] == tokenizer.encode_chat([{"role": "user", "content": "Mia has 14 apples.\n"}])


def test_chat_prompts_are_not_healed():
    qwen3 = load_tokenizer(ROOT / "tests" / "fixtures" / "qwen3-tokenizer")
    ids, choices = encode_for_generation(Prompt("test", text="Write a loop "), qwen3)
    assert choices is None and ids == qwen3.encode_chat([{"role": "user", "content": "Write a loop "}])


def test_the_sorted_vocabulary_is_built_once_per_tokenizer():
    """Healing a prompt must not rebuild a list of every token's text (Qwen3: 150,000, ~45 ms a call)."""
    import tracemalloc

    qwen3 = load_tokenizer(ROOT / "tests" / "fixtures" / "qwen3-tokenizer")
    qwen3.tokens_starting_with("\n")  # the first call builds the index
    tracemalloc.start()
    for piece in ("\n", " ", "de", "\t"):
        qwen3.tokens_starting_with(piece)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200_000, f"{peak} bytes allocated: the vocabulary was copied again"  # a 150,000-entry list is 1.2 MB
