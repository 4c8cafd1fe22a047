"""How often the target solves word problems: greedy answers, checked against the known result.

    python recipes/word_problems/evaluate_target.py --problems recipes/word_problems/work/heldout_problems.jsonl

Each problem is asked through the chat template, as `generate.py` asks it, and the
reply is correct when its last number is the expected answer (the replies end with
`The answer is N.`). Prints the accuracy overall and by kind, and the mean
distinct-4-gram ratio of the replies (1.0: no phrase of four tokens repeats).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from dflash.cli import OneLineErrors, UsageError, run_cli
from dflash.data import generate_batch
from dflash.measure import distinct_ngram_ratio, final_number
from dflash.qwen3 import Qwen3
from dflash.tokenizer import load_tokenizer
from recipes.word_problems.paths import WEIGHTS, WORK, require


def read_problems(path: Path) -> list[dict]:
    problems = [json.loads(line) for line in require(path, "build_corpus.py").read_text().splitlines() if line.strip()]
    if not problems or not all("messages" in p and "answer" in p for p in problems):
        raise UsageError(f"{path}: expected JSONL records with 'messages' and 'answer'")
    return problems


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=WORK / "tiny-qwen3")
    parser.add_argument("--problems", type=Path, default=WEIGHTS / "heldout_problems.jsonl")
    parser.add_argument("--count", type=int, default=None, help="only the first COUNT problems")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--show-wrong", type=int, default=3, help="print this many wrong replies")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    return parser


def main(args: argparse.Namespace) -> int:
    target = Qwen3.from_pretrained(require(args.target / "config.json", "train_target.py").parent)
    tokenizer = load_tokenizer(args.target)
    problems = read_problems(args.problems)[:args.count]
    prompts = [tokenizer.encode_chat(p["messages"]) for p in problems]
    replies = []
    for start in tqdm(range(0, len(prompts), args.batch_size), desc="answering", unit="batch"):
        replies += generate_batch(target, prompts[start:start + args.batch_size], args.max_new_tokens, 0.0,
                                  tokenizer.stop_token_ids, None)
    by_kind, wrong = defaultdict(list), []
    for problem, reply in zip(problems, replies):
        text = tokenizer.decode(reply, skip_special_tokens=True)
        correct = final_number(text) == str(problem["answer"])
        by_kind[problem.get("kind", "-")].append(correct)
        if not correct:
            wrong.append((problem["messages"][-1]["content"], text))
    total = sum(sum(v) for v in by_kind.values())
    distinct = sum(distinct_ngram_ratio(r) for r in replies) / len(replies)
    print(f"{args.problems}: {total}/{len(problems)} correct ({100 * total / len(problems):.1f} %), "
          f"mean distinct-4-gram ratio {distinct:.3f}")
    for kind, results in sorted(by_kind.items()):
        print(f"  {kind:<15} {sum(results):4d}/{len(results):<4d} {100 * sum(results) / len(results):5.1f} %")
    for question, text in wrong[:args.show_wrong]:
        print(f"wrong: {question!r}\n    -> {text!r}")
    if args.json:
        figures = {"problems": str(args.problems), "correct": total, "count": len(problems),
                   "distinct_4gram": distinct,
                   "by_kind": {k: [sum(v), len(v)] for k, v in sorted(by_kind.items())}}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
