"""The demo pair and its held-out prompts, loaded once for the solution scripts (not an exercise).

Import it from a script run in tutorials/ (`python solutions/NN_name.py`): Python puts the
script's folder on the path, and this puts the repository root there too, as the notebooks do.
"""

import json
import sys
from pathlib import Path

ROOT = Path.cwd().parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dflash.drafter import Drafter  # noqa: E402
from dflash.qwen3 import Qwen3  # noqa: E402
from dflash.tokenizer import load_tokenizer  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
target = Qwen3.from_pretrained(ROOT / "weights/tiny-qwen3")
drafter = Drafter.from_pretrained(ROOT / "weights/tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(ROOT / "weights/tiny-qwen3")
block = drafter.config.block_size


def heldout_prompts(count: int) -> list[list[int]]:
    """The first `count` held-out problems, through the chat template: (count,) lists of ids."""
    lines = (ROOT / "weights/heldout_problems.jsonl").read_text().splitlines()[:count]
    return [tokenizer.encode_chat(json.loads(line)["messages"]) for line in lines]


def notebook4_data(questions: int = 64, evaluated: int = 12):
    """Notebook 4's data: the target's answers (a JSONL made by make_data.py) to `questions` problems from the
    training side of the split, and `evaluated` held-out prompts (ids, token healing's choices)."""
    import contextlib
    import io
    import random
    import tempfile

    sys.path.insert(0, str(ROOT / "recipes" / "word_problems"))
    import make_data
    from build_corpus import is_heldout
    from dflash.prompts import encode_for_generation, read_prompts
    from problems import make_problem

    rng, picked = random.Random(0), {}
    while len(picked) < questions:
        problem = make_problem(rng)
        if not is_heldout(problem):
            picked.setdefault(problem.question, problem)
    work = Path(tempfile.mkdtemp())
    prompt_file, data = work / "train_prompts.jsonl", work / "data.jsonl"
    prompt_file.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in picked))
    with contextlib.redirect_stderr(io.StringIO()):
        assert make_data.main(["--target", str(ROOT / "weights/tiny-qwen3"), "--prompts", str(prompt_file), "--out",
                               str(data), "--max-new-tokens", "64", "--batch-size", "64", "--device", "cpu"]) == 0
    prompts = read_prompts(ROOT / "weights/heldout_problems.jsonl")[:evaluated]
    return data, [encode_for_generation(p, tokenizer) for p in prompts]
