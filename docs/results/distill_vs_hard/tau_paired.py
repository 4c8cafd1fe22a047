"""tau of drafters on the same prompts, through dflash/evaluation.py's replay of greedy DFlash
(acceptance_lengths: the target's greedy answers, float32, CPU, one thread), with each prompt's
(tokens, steps) kept, so that two drafters are compared prompt by prompt: a paired bootstrap over
the prompts gives a 95% interval for the difference in tau (the prompts' sampling noise only,
not the training seed's).
    PYTHONPATH=. python tau_paired.py --out FILE.json DRAFTER...   (from a checkout's root)"""
import argparse
import json
import random
from pathlib import Path

import torch

from dflash.drafter import Drafter
from dflash.evaluation import acceptance_lengths, held_out
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer, stop_token_ids
from dflash.training import Distributed

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("drafters", nargs="+")
parser.add_argument("--target", default="weights/tiny-qwen3")
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--out", required=True)
parser.add_argument("--prompts", nargs="+",
                    default=["weights/heldout_problems.jsonl", "weights/handwritten_problems.jsonl"])
args = parser.parse_args()
target = Qwen3.from_pretrained(args.target).eval()
tokenizer = find_tokenizer(Path(args.target), True)
stops = stop_token_ids(Path(args.target), tokenizer)
per_prompt = {}  # prompts file -> drafter -> [(tokens, steps)] per prompt
with torch.no_grad():
    drafters = {name: Drafter.from_pretrained(name, target).eval() for name in args.drafters}
    for prompts in args.prompts:
        first = next(iter(drafters.values()))
        continuations = held_out(Path(prompts), target, first, tokenizer, stop_ids=stops,
                                 max_new_tokens=args.max_new_tokens, token_healing=True,
                                 place=Distributed())
        per_prompt[prompts] = {}
        for name, drafter in drafters.items():
            rows = []
            for continuation in continuations:
                lengths = acceptance_lengths(target, drafter, continuation)
                rows.append((sum(lengths), len(lengths)))
            per_prompt[prompts][name] = rows
            tau = sum(t for t, _ in rows) / sum(s for _, s in rows)
            print(json.dumps({"prompts": prompts, "drafter": name, "count": len(rows),
                              "tau": round(tau, 4)}), flush=True)


def tau_of(rows, picks):
    return sum(rows[i][0] for i in picks) / sum(rows[i][1] for i in picks)


rng = random.Random(0)
summary = {}
for prompts, by_drafter in per_prompt.items():
    names = list(by_drafter)
    for other in names[1:]:
        a, b = by_drafter[names[0]], by_drafter[other]
        count = len(a)
        differences = []
        for _ in range(10_000):
            picks = [rng.randrange(count) for _ in range(count)]
            differences.append(tau_of(b, picks) - tau_of(a, picks))
        differences.sort()
        line = {"prompts": prompts, "minus": names[0], "drafter": other,
                "tau_difference": round(tau_of(b, range(count)) - tau_of(a, range(count)), 4),
                "bootstrap_95": [round(differences[250], 4), round(differences[9750], 4)]}
        print(json.dumps(line), flush=True)
        summary[f"{other} - {names[0]} on {prompts}"] = line
Path(args.out).write_text(json.dumps({"per_prompt": per_prompt, "differences": summary},
                                     indent=1))
