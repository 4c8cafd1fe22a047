"""Notebook 8, exercise 3: how cheap would an autoregressive drafter's passes have to be?

Its steps at block B cost t_verify[B] + rest + (B - 1) * pass_ms and commit tau(alpha, B)
tokens; DFlash's at block 16 commit dflash_speed tokens per ms of steps. Equal speed gives
pass_ms = (tau / dflash_speed - t_verify[B] - rest) / (B - 1), and no budget when that is
negative (even free passes fall short). This script measures what the notebook measures, on
fewer repeats: DFlash's tau at block 16, the rest of a step, the isolated pass times.

Run from tutorials/: python solutions/08_ar_pass_budget.py
"""

import sys
import time
from pathlib import Path

ROOT = Path.cwd().parent  # the repository root
sys.path.insert(0, str(ROOT))

import torch

import generate
from dflash.measure import BenchPrompt, Loops, loop_figures
from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.tokenizer import load_tokenizer
from generate import ModelRunner, decode_pass

torch.set_grad_enabled(False)
torch.set_num_threads(1)
WEIGHTS = ROOT / "weights"
target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)
tokenizer = load_tokenizer(WEIGHTS / "tiny-qwen3")
B_MAX, MAX_NEW = drafter.config.block_size, 96
prompts = [BenchPrompt(p.where, *encode_for_generation(p, tokenizer), p.answer)
           for p in read_prompts(WEIGHTS / "heldout_problems.jsonl")[:24]]

# DFlash at block 16 on the notebook's prompts: tau (the same every run), the rest of a step (timed)
loops = Loops(target, drafter, tokenizer.stop_token_ids, seed=0, max_new_tokens=MAX_NEW,
              max_length=max(len(p.ids) for p in prompts) + MAX_NEW + 2 * B_MAX, engine=generate)
loops.run("DFlash", B_MAX, prompts[0], 0.0, 32)  # first-call costs
runs = [loops.measure("DFlash", B_MAX, p, 0.0) for p in prompts]
figures = loop_figures(runs, B_MAX)  # the pooled figures benchmarks/bench.py prints
tau16, rest = figures["tau"], figures["per_step_ms"]["accept_and_bookkeeping"]

# isolated pass times, fastest of 9: verify at every block, DFlash's draft at 16, one AR pass
ids = prompts[0].ids
n, prompt = len(ids), torch.tensor([ids])
t_verify, t_draft = {}, None
runners = {}
for block in range(2, B_MAX + 1):
    runner = ModelRunner(target, drafter, max_length=n + 3 * B_MAX, block_size=block)
    last, context = runner.prefill(prompt, 0.0, None)
    drafts = runner.draft(context, last, n).clone()
    _, features = runner.verify(drafts, 0.0, None)
    runners[block] = (runner, last, drafts, features.clone())
c = drafter.config.layers
torch.manual_seed(0)
ar = Qwen3(Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                       num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                       num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, tie_word_embeddings=True))
ar_cache = ar.new_cache(n + 2)
ar(prompt, cache=ar_cache)
ar_cache.extend(n)


def fastest(call, repeats: int = 9) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        best = min(best, 1000 * (time.perf_counter() - began))
    return best


for block, (runner, last, drafts, features) in runners.items():
    t_verify[block] = fastest(lambda: (runner.target_cache.trim(n), runner.verify(drafts, 0.0, None)))
runner, last, drafts, features = runners[B_MAX]
t_draft = fastest(lambda: (runner.drafter_cache.trim(n), runner.draft(features, last, n + B_MAX)))
ar_pass = fastest(lambda: (decode_pass(ar, ar_cache, prompt[:, -1:], torch.tensor([n]), True), ar_cache.trim(n)))
dflash_speed = tau16 / (t_draft + t_verify[B_MAX] + rest)  # tokens per ms of steps


def tau_constant(alpha: float, block: int) -> float:
    return float(block) if alpha == 1 else (1 - alpha ** block) / (1 - alpha)


def ar_speed(alpha: float, block: int, pass_ms: float) -> float:
    return tau_constant(alpha, block) / (t_verify[block] + rest + (block - 1) * pass_ms)


def ar_pass_budget(alpha: float, block: int) -> float | None:
    """The most a pass may cost (ms) for block - 1 of them to draft as fast per token as DFlash at 16."""
    room = tau_constant(alpha, block) / dflash_speed - t_verify[block] - rest  # ms left for the passes
    return room / (block - 1) if room >= 0 else None


if __name__ == "__main__":
    lengths = [length for run in runs for length in run.result.acceptance_lengths]
    alpha_hat = sum(length - 1 for length in lengths) / sum(min(length, B_MAX - 1) for length in lengths)  # kept/judged
    for alpha, block in [(1.0, 16), (1.0, 4), (0.95, 8), (alpha_hat, 16), (0.5, 2)]:  # the notebook's checks
        budget = ar_pass_budget(alpha, block)
        if budget is None:
            assert ar_speed(alpha, block, 0.0) <= dflash_speed
        else:
            assert budget >= 0 and abs(ar_speed(alpha, block, budget) / dflash_speed - 1) < 1e-9
    budgets = {b: ar_pass_budget(1.0, b) for b in t_verify}
    roomiest = max((b for b in budgets if budgets[b] is not None), key=budgets.get)
    print(f"DFlash at block 16: tau {tau16:.2f}, {dflash_speed:.2f} tokens per ms of steps "
          f"(one alpha: {alpha_hat:.3f})")
    print("a perfect AR drafter's budget per pass, ms: " + " ".join(
        f"{b}:{'-' if v is None else f'{v:.2f}'}" for b, v in budgets.items()))
    print(f"the most room at block {roomiest}: {budgets[roomiest]:.2f} ms a pass; a pass of ours takes "
          f"{ar_pass:.2f} ms ({ar_pass / t_draft:.2f} of DFlash's whole draft at block 16)")
    # A pass of the autoregressive drafter costs a good share of DFlash's one pass, and it needs B - 1 of them:
    # when its budget is below what a pass costs, even perfect guesses cannot make it match DFlash on this CPU.
