"""The slow one (~2 minutes on a laptop CPU): does train.py actually teach a drafter to draft?

The whole workflow on the `qwen3-tiny` fixture target (it has no tokenizer, so prompts
are random token ids): the target answers its own prompts (`make_data.py`), a small
drafter trains on those answers for about a minute, and then *real* speculative
decoding on held-out prompts must commit at least 2 tokens per target pass, where the
untrained drafter commits about 1. A random target's greedy answers are repetitive;
that is a learnable pattern, which is all this test needs.
"""

import json
import time
from pathlib import Path

import torch

import generate
import make_data
import train
from dflash.drafter import Drafter
from dflash.evaluation import evaluate, greedy_continuations
from dflash.qwen3 import Qwen3

TINY = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "qwen3-tiny"
NEW_TOKENS = 32


def random_prompts(path: Path, count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 512, (8,), generator=generator).tolist() for _ in range(count)]
    path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    return prompts


def mean_tau(target: Qwen3, drafter: Drafter, prompts: list[list[int]]) -> float:
    continuations = greedy_continuations(target, [(ids, None) for ids in prompts], NEW_TOKENS, (),
                                         drafter.config.block_size)
    return evaluate(target, drafter.config, drafter.state_dict(), continuations)["eval_tau"]


def test_slow_training_teaches_the_drafter_to_draft(tmp_path):
    began = time.perf_counter()
    random_prompts(tmp_path / "prompts.jsonl", 2000, seed=0)  # enough answers to generalise, not memorise
    held_out = random_prompts(tmp_path / "held_out.jsonl", 12, seed=1)
    assert make_data.main(["--target", str(TINY), "--prompts", str(tmp_path / "prompts.jsonl"),
                           "--out", str(tmp_path / "data.jsonl"), "--max-new-tokens", "48", "--batch-size", "200",
                           "--device", "cpu"]) == 0

    target = train.freeze(Qwen3.from_pretrained(TINY))
    options = ["--drafter-layers", "1", "--block-size", "8", "--num-anchors", "64", "--batch-size", "16",
               "--lr", "5e-3", "--seed", "0", "--device", "cpu"]
    cfg = train.TrainConfig(drafter_layers=1, block_size=8)
    untrained = Drafter(train.build_drafter_config(cfg, target.config, None))
    train.init_drafter(untrained, seed=0)
    tau_untrained = mean_tau(target, untrained, held_out)

    out = tmp_path / "run"
    assert train.main(["--target", str(TINY), "--data", str(tmp_path / "data.jsonl"), "--out", str(out),
                       "--steps", "300", *options]) == 0
    drafter = Drafter.from_pretrained(out, target=target)
    tau_trained = mean_tau(target, drafter, held_out)
    print(f"\ntau untrained {tau_untrained:.2f}, trained {tau_trained:.2f}, "
          f"{time.perf_counter() - began:.0f} s in all")
    assert tau_untrained < 1.3
    assert tau_trained >= 2.0

    for prompt in held_out[:3]:  # speculative decoding changes the speed, never the greedy text
        fast = generate.generate_dflash(target, drafter, prompt, NEW_TOKENS)
        plain = generate.generate_autoregressive(target, prompt, NEW_TOKENS)
        assert fast.new_ids == plain.new_ids
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
