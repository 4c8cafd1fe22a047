"""The recipe's drafter questions (build_corpus.py --seed 0: train[:20000]) without writing
the corpus or weights/heldout_problems.jsonl: the training side is drawn first from Random(0),
so its first 20,000 problems are the same whatever --train-count is."""

import json
import random

from recipes.word_problems.build_corpus import problems_of_split
from recipes.word_problems.problems import chat_messages

train = problems_of_split(20_000, heldout=False, rng=random.Random(0))
with open("/work/distill_runs/train_questions.jsonl", "w") as f:
    for p in train:
        f.write(json.dumps({"messages": chat_messages(p)[:1]}) + "\n")
