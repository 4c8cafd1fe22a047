"""Train the demo model's tokenizer: a byte-level BPE learned from the corpus's train part.

Qwen3 uses a byte-level BPE with 151,643 learned tokens plus its chat special tokens.
Ours is the same kind of object, trained the same way, only about 150x smaller
(1,020 tokens by default): a tiny model cannot afford a huge embedding table, and
word problems need few words.

"Byte-level" means the text is first turned into bytes and each byte into one of
256 printable stand-in characters (the `ByteLevel.alphabet()`), so every string has a
tokenization: nothing is ever "unknown", and decoding gives back exactly the input.
BPE then merges the most frequent adjacent pair again and again, until the
vocabulary is full. Before BPE, the text is cut by Qwen's own pre-tokenizer pattern
(`QWEN_SPLIT`): every digit on its own, so numbers are spelled the same way wherever
they appear, and a run of newlines one piece whatever follows it, so that a prompt
ending in "\n\n" (the chat template's `</think>\n\n`) is cut as the same text is
cut inside a training conversation. GPT-2's pattern (`--split gpt2`) cuts "\n\nThe"
into "\n", "\n", "The" but a final "\n\n" into one piece, and a model trained on
the first never meets the second; `--resplit` gives an existing tokenizer Qwen's
pattern and keeps its merges (how the shipped tokenizer was made: `weights/README.md`).

The special tokens are Qwen3's chat tokens, matched whole before BPE sees the text:
  <|endoftext|>  ends every document;  <|im_start|>, <|im_end|>  open and close a turn
  (generation stops on <|im_end|>);  <think>, </think>  the (empty) reasoning block

There is no mask token: as in the released DFlash drafters, the drafter's mask id is
the first id past the tokenizer (`len(tokenizer)`), a row the target's embedding
table has because its vocabulary is padded to a multiple of 8 (as Qwen3's 151,936 is).

Outputs (in `--out`, default `weights/tiny-qwen3/`, the demo target's folder):
  tokenizer.json          the tokenizer, loadable with `tokenizers.Tokenizer.from_file`
  tokenizer_config.json   the special tokens, as in a Qwen3 checkpoint folder
  generation_config.json  the stop ids, and Qwen3's recommended sampling settings (greedy stays the default)

Usage:  python recipes/word_problems/train_tokenizer.py [--vocab-size 1020]   (after build_corpus.py)
Then:   python recipes/word_problems/tokenize_corpus.py   (the corpus as token ids)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from dflash.checkpoint import write_json_atomically
from dflash.cli import OneLineErrors, run_cli
from recipes.word_problems.paths import CORPUS, WEIGHTS, require

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END, "<think>", "</think>"]  # their order gives their ids: 0 to 4


def read_documents(text_file: Path, limit: int | None = None) -> list[str]:
    """The corpus's documents (at most `limit`), cut apart at `<|endoftext|>`."""
    text = text_file.read_text(encoding="utf-8")
    return [doc.removeprefix("\n") for doc in text.split(END_OF_TEXT) if doc.strip()][:limit]


# Qwen2/Qwen3's pre-tokenizer pattern, as their tokenizer.json writes it.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")


def pre_tokenizer(split: str):
    """Qwen's pattern then bytes -> stand-in characters; or ("gpt2") digits apart, then GPT-2's pattern.

    `add_prefix_space=False` keeps the text exactly as written (GPT-2's habit of
    inserting a space before the first word would break the round trip).
    """
    if split == "qwen":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])


def new_tokenizer(split: str) -> Tokenizer:
    """An empty byte-level BPE: pieces, bytes -> stand-in characters -> merges, and back."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer(split)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train(tokenizer: Tokenizer, documents: list[str], vocab_size: int) -> None:
    """Learn the merges from the documents themselves.

    We pass the files one by one rather than the joined text, so the end-of-text
    marker never takes part in the pair counts: it is added as a special token,
    matched whole before BPE ever sees the text.
    """
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a pair seen once is noise, not a pattern
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=True,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))


def check_special_ids(tokenizer: Tokenizer) -> None:
    """The rest of the project relies on these ids; stop loudly if they moved."""
    for expected, token in enumerate(SPECIAL_TOKENS):
        actual = tokenizer.token_to_id(token)
        if actual != expected:
            raise SystemExit(f"{token} got id {actual}, expected {expected}")


def write_folder_configs(folder: Path, tokenizer: Tokenizer) -> None:
    """The two small JSON files that sit next to `tokenizer.json` in a Qwen3 checkpoint folder."""
    end_of_text, im_end = tokenizer.token_to_id(END_OF_TEXT), tokenizer.token_to_id(IM_END)
    tokenizer_config = {
        "eos_token": IM_END,  # a chat turn ends here, as in Qwen3's instruct checkpoints
        "pad_token": END_OF_TEXT,
        "model_max_length": 1024,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    generation_config = {  # Qwen3's layout and its recommended non-thinking sampling settings
        "eos_token_id": [im_end, end_of_text], "pad_token_id": end_of_text,
        "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
    }
    write_json_atomically(folder / "tokenizer_config.json", tokenizer_config)
    write_json_atomically(folder / "generation_config.json", generation_config)


def check_round_trip(tokenizer: Tokenizer, documents: list[str], count: int) -> None:
    """decode(encode(x)) must give x back exactly, end-of-text marker included."""
    for doc in documents[:count]:
        text = doc + END_OF_TEXT
        ids = tokenizer.encode(text).ids
        if tokenizer.decode(ids, skip_special_tokens=False) != text:
            raise SystemExit("round trip failed on a held-out file")
        if ids.count(tokenizer.token_to_id(END_OF_TEXT)) != 1:
            raise SystemExit("the end-of-text marker was not encoded as its one special token")
        for digit in "0123456789":
            if digit in doc and tokenizer.token_to_id(digit) not in ids:
                raise SystemExit(f"digit {digit} was merged into a longer token")
    print(f"round trip: exact on {min(count, len(documents))} held-out documents")


def tokens_per_byte(tokenizer: Tokenizer, documents: list[str]) -> float:
    """How many tokens an average byte of unseen code costs (lower = better compression)."""
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(documents))
    return tokens / sum(len(doc.encode("utf-8")) for doc in documents)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=1020, help="tokens in the vocabulary, specials included")
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="folder with train.txt and heldout.txt")
    parser.add_argument("--out", type=Path, default=WEIGHTS / "tiny-qwen3",
                        help="folder for tokenizer.json and the two configs")
    parser.add_argument("--check-files", type=int, default=200, help="held-out documents to round-trip")
    parser.add_argument("--train-documents", type=int, default=100_000, help="documents the merges are learnt from")
    parser.add_argument("--split", choices=["qwen", "gpt2"], default="qwen", help="the pre-tokenizer pattern")
    parser.add_argument("--resplit", type=Path, default=None,
                        help="instead of training: this tokenizer.json with Qwen's pattern, its merges kept")
    return parser


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    train_docs = read_documents(require(args.corpus / "train.txt", "recipes/word_problems/build_corpus.py"),
                                args.train_documents)
    heldout_docs = read_documents(require(args.corpus / "heldout.txt", "recipes/word_problems/build_corpus.py"))
    if args.resplit is not None:
        tokenizer = Tokenizer.from_file(str(require(args.resplit, "train_tokenizer.py --split gpt2")))
        tokenizer.pre_tokenizer = pre_tokenizer("qwen")
    else:
        tokenizer = new_tokenizer(args.split)
        train(tokenizer, train_docs, args.vocab_size)
    check_special_ids(tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out / "tokenizer.json"))
    write_folder_configs(args.out, tokenizer)
    made = f"re-split {args.resplit}" if args.resplit else f"trained on {len(train_docs)} documents"
    print(f"{tokenizer.get_vocab_size()} tokens, {made}, in {time.perf_counter() - start:.1f} s "
          f"-> {args.out / 'tokenizer.json'}")
    check_round_trip(tokenizer, heldout_docs, args.check_files)
    print(f"held-out: {tokens_per_byte(tokenizer, heldout_docs):.3f} tokens per byte")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
