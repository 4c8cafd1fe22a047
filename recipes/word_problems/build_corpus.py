"""Write the word-problem corpus: chat-rendered problems for the target, questions for the drafter.

    python recipes/word_problems/build_corpus.py --seed 0

Every problem is a one-turn conversation rendered through Qwen3's chat template with
thinking off, exactly as `generate.py` renders a prompt for a real Qwen3, so the demo
takes the same path as Qwen3-8B and stops on `<|im_end|>`. Documents are separated
by `<|endoftext|>`.

The held-out split is disjoint from training by construction: a problem belongs to
the held-out side when a hash of its question text says so, and each side keeps only
its own problems. The same question can therefore never be in both.

Writes (scratch, in `recipes/word_problems/work/`):
  corpus/train.txt, corpus/heldout.txt    the rendered conversations
  train_questions.jsonl                   questions the target answers for the drafter's data
and the shipped prompt set `weights/heldout_problems.jsonl` (question, kind and answer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter

from tqdm import tqdm

from dflash.cli import OneLineErrors, UsageError, run_cli
from dflash.tokenizer import END_OF_TEXT, apply_qwen3_chat_template
from recipes.word_problems.paths import CORPUS, WEIGHTS, WORK
from recipes.word_problems.problems import Problem, chat_messages, make_problem


def is_heldout(problem: Problem, one_in: int = 50) -> bool:
    """A fixed, seed-independent split by the question's text: one problem in `one_in` is held out."""
    digest = hashlib.sha256(problem.question.encode()).digest()
    return int.from_bytes(digest[:4], "little") % one_in == 0


def problems_of_split(count: int, heldout: bool, rng: random.Random) -> list[Problem]:
    """`count` distinct problems of one side of the split."""
    seen, problems = set(), []
    with tqdm(total=count, desc="held-out" if heldout else "train", unit="problem") as progress:
        while len(problems) < count:
            problem = make_problem(rng)
            if is_heldout(problem) == heldout and problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
                progress.update(1)
    return problems


def render(problem: Problem) -> str:
    """The conversation as the target reads it, answer included."""
    text = apply_qwen3_chat_template(chat_messages(problem), add_generation_prompt=False)
    prompt = apply_qwen3_chat_template(chat_messages(problem)[:1], add_generation_prompt=True)
    assert text.startswith(prompt), "the training text must extend the prompt generate.py renders"
    return text


def write_lines(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-count", type=int, default=500_000, help="problems the target trains on")
    parser.add_argument("--heldout-count", type=int, default=2_000, help="held-out problems (loss, accuracy)")
    parser.add_argument("--question-count", type=int, default=20_000,
                        help="training questions for the drafter's data (a prefix of the training problems)")
    parser.add_argument("--shipped-count", type=int, default=60, help="held-out problems shipped in weights/ (benchmarks/bench.py's)")
    return parser


def main(args: argparse.Namespace) -> int:
    for name in ("train_count", "heldout_count", "question_count", "shipped_count"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.question_count > args.train_count or args.shipped_count > args.heldout_count:
        raise UsageError("--question-count and --shipped-count take a prefix of their split: they cannot exceed it")
    rng = random.Random(args.seed)
    train = problems_of_split(args.train_count, heldout=False, rng=rng)
    heldout = problems_of_split(args.heldout_count, heldout=True, rng=rng)
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train", train), ("heldout", heldout)):
        text = "".join(render(p) + END_OF_TEXT + "\n" for p in problems)
        (CORPUS / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(problems):,} problems, {len(text) / 1e6:.1f} MB, "
              f"kinds {dict(sorted(Counter(p.kind for p in problems).items()))}")
    write_lines(WORK / "train_questions.jsonl",
                ({"messages": chat_messages(p)[:1]} for p in train[:args.question_count]))
    write_lines(WORK / "heldout_problems.jsonl",
                ({"messages": chat_messages(p)[:1], "kind": p.kind, "answer": p.answer} for p in heldout))
    write_lines(WEIGHTS / "heldout_problems.jsonl",
                ({"messages": chat_messages(p)[:1], "kind": p.kind, "answer": p.answer}
                 for p in heldout[:args.shipped_count]))
    print(f"wrote {args.question_count:,} drafter questions and {args.shipped_count} shipped held-out problems")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
