"""Turn the corpus text into token ids once, so training never tokenizes.

Each part (`train.txt`, `heldout.txt`) becomes a flat array of uint16 ids
(`train.bin`, `heldout.bin`) written with `ndarray.tofile`: no header, just the
numbers, so the training loop can open it with `np.memmap(path, dtype=np.uint16)`
and slice random windows without reading the whole file. uint16 is enough
because the vocabulary (1,020) is far below 65,536, and halves the size of int32.

Speed: `encode_batch` tokenizes many strings in parallel (Rust threads), so we
cut the text into chunks of whole files and hand over a batch of chunks at a time.
Cutting right after an `<|endoftext|>` changes nothing: a special token is always
a boundary, so the ids of the pieces, concatenated, are the ids of the whole.
We check that anyway, by decoding the array back and comparing with the text.

Usage:  python recipes/word_problems/tokenize_corpus.py   (after build_corpus.py and train_tokenizer.py)
Then:   python recipes/word_problems/train_target.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from dflash.cli import OneLineErrors, UsageError, run_cli
from recipes.word_problems.paths import CORPUS, WORK, require

END_OF_TEXT = "<|endoftext|>"


def split_after_end_of_text(text: str) -> list[str]:
    """Cut the text just after every `<|endoftext|>`; joining the pieces gives the text back."""
    pieces = [piece + END_OF_TEXT for piece in text.split(END_OF_TEXT)]
    pieces[-1] = pieces[-1].removesuffix(END_OF_TEXT)  # the tail after the last marker
    return [piece for piece in pieces if piece]


def encode(tokenizer: Tokenizer, pieces: list[str], batch_size: int, name: str) -> np.ndarray:
    """Encode the pieces a batch at a time, with a progress bar, into one uint16 array."""
    arrays = []
    with tqdm(total=len(pieces), desc=f"encoding {name}", unit="file") as progress:
        for start in range(0, len(pieces), batch_size):
            batch = pieces[start:start + batch_size]
            for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
                arrays.append(np.asarray(encoding.ids, dtype=np.uint16))
            progress.update(len(batch))
    return np.concatenate(arrays)


def check_exact(tokenizer: Tokenizer, ids: np.ndarray, text: str, name: str) -> None:
    """The ids must decode to exactly the text: nothing lost, nothing reordered."""
    if tokenizer.decode(ids.tolist(), skip_special_tokens=False) != text:
        raise SystemExit(f"{name}: the token ids do not decode back to the text")


def tokenize_part(tokenizer: Tokenizer, corpus: Path, name: str, batch_size: int) -> tuple[int, int]:
    """Write `<name>.bin` from `<name>.txt`; return (bytes of text, tokens)."""
    text = require(corpus / f"{name}.txt", "recipes/word_problems/build_corpus.py").read_text(encoding="utf-8")
    ids = encode(tokenizer, split_after_end_of_text(text), batch_size, name)
    check_exact(tokenizer, ids, text, name)
    ids.tofile(corpus / f"{name}.bin")
    return len(text.encode("utf-8")), len(ids)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="folder with train.txt and heldout.txt; the .bin files go here too")
    parser.add_argument("--tokenizer", type=Path, default=WORK / "tiny-qwen3" / "tokenizer.json")
    parser.add_argument("--batch-size", type=int, default=32, help="files per encode_batch call")
    return parser


def main(args: argparse.Namespace) -> int:
    tokenizer = Tokenizer.from_file(str(require(args.tokenizer, "recipes/word_problems/train_tokenizer.py")))
    if tokenizer.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise UsageError(f"vocabulary of {tokenizer.get_vocab_size()} does not fit in uint16")
    for name in ("train", "heldout"):
        start = time.perf_counter()
        num_bytes, num_tokens = tokenize_part(tokenizer, args.corpus, name, args.batch_size)
        print(f"{name:>8}: {num_bytes / 1e6:6.2f} MB -> {num_tokens:10,d} tokens "
              f"({num_tokens / num_bytes:.3f} tokens/byte) in {time.perf_counter() - start:.1f} s "
              f"-> {args.corpus / (name + '.bin')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
