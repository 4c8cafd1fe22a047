"""Train the tiny Qwen3 demo target with a plain next-token loop (after tokenize_corpus.py).

    python recipes/word_problems/train_target.py --minutes 75 --seed 0

The model is a real Qwen3 (grouped-query attention, q/k norm, `head_dim` decoupled
from `hidden_size`, tied embeddings), only small enough to train on a laptop CPU.
Training is the textbook recipe: random windows of the token stream, AdamW,
linear warm-up then cosine decay, gradient clipping. By default the schedule
follows the clock (`--minutes`), so the run ends on time however busy the CPU is;
`--steps` fixes the step count instead, for a bit-reproducible run.
`--init-from` starts a second phase from a saved checkpoint's weights, with a fresh
optimizer and schedule. The embedding table has the tokenizer's size rounded up to
a multiple of 8, as Qwen3's has (151,936 rows for 151,669 tokens): the first spare
row is the drafter's mask token.
A checkpoint (model, optimizer, RNG, step) is written atomically every few
minutes (to `recipes/word_problems/work/target_state.pt`, scratch); `--resume`
continues from it. The result is saved in the official layout next to the tokenizer,
in `recipes/word_problems/work/tiny-qwen3/` (then copied to `weights/`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

from dflash.checkpoint import write_json_atomically
from dflash.cli import OneLineErrors, run_cli
from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.training import init_weights, load_training_state, optimizer_step, save_training_state
from recipes.word_problems.paths import CORPUS, WORK, require


def build_model(vocab_size: int, args) -> Qwen3:
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, tie_word_embeddings=True, max_position_embeddings=args.max_positions,
    )
    return init_weights(Qwen3(config), seed=None)  # drawn from the global generator, which main seeded


def random_windows(tokens: np.ndarray, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """`batch` windows of `length + 1` tokens at random offsets: inputs and shifted targets."""
    starts = torch.randint(0, len(tokens) - length - 1, (batch,), generator=generator)
    rows = [torch.from_numpy(tokens[s:s + length + 1].astype(np.int64)) for s in starts.tolist()]
    return torch.stack(rows)  # (batch, length + 1)


def learning_rate(done: float, peak: float, warmup: float) -> float:
    """Linear warm-up over the first `warmup` fraction of training, then cosine down to 10 %.

    Not `dflash.training.cosine_with_warmup`: this schedule follows the fraction of the
    run done (of the time budget, or of `--steps`), not a step count known in advance,
    and it ends at 10 % of the peak rather than 0.
    """
    if done < warmup:
        return peak * max(done, 1e-3) / warmup
    progress = (done - warmup) / (1 - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def next_token_loss(model: Qwen3, windows: torch.Tensor) -> torch.Tensor:
    hidden, _ = model(windows[:, :-1])  # (batch, length, hidden)
    logits = model.logits(hidden)  # (batch, length, vocab)
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def heldout_loss(model: Qwen3, heldout: torch.Tensor) -> float:
    model.eval()
    loss = sum(next_token_loss(model, chunk).item() for chunk in heldout.split(8)) / len(heldout.split(8))
    model.train()
    return loss


def log_heldout(log: list[dict]) -> float:
    """The latest held-out loss in the log (NaN before the first evaluation)."""
    return next((e["heldout_loss"] for e in reversed(log) if "heldout_loss" in e), float("nan"))


def make_optimizer(model: Qwen3, lr: float) -> torch.optim.AdamW:
    """Weight decay on matrices only; norms and the embedding stay undecayed."""
    decayed = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    others = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def save_state(path: Path, model, optimizer, step, total, generator, log) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "total": total,
             "generator": generator.get_state(), "log": json.dumps(log)}
    save_training_state(path, state)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--tokenizer", type=Path, default=WORK / "tiny-qwen3" / "tokenizer.json")
    parser.add_argument("--out", type=Path, default=WORK / "tiny-qwen3")
    parser.add_argument("--work", type=Path, default=WORK, help="scratch: resume state and log")
    parser.add_argument("--minutes", type=float, default=75.0, help="time budget; the schedule follows the clock")
    parser.add_argument("--steps", type=int, default=None, help="a fixed step count instead (bit-reproducible)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=float, default=0.04, help="fraction of training spent warming up")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64, help="heads * head_dim = 256 != hidden, as in Qwen3")
    parser.add_argument("--max-positions", type=int, default=1024)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="a Qwen3 checkpoint folder to start from (its shape overrides the shape options)")
    return parser


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train = np.fromfile(require(args.corpus / "train.bin", "recipes/word_problems/tokenize_corpus.py"), dtype=np.uint16)
    heldout_tokens = np.fromfile(require(args.corpus / "heldout.bin", "recipes/word_problems/tokenize_corpus.py"),
                                 dtype=np.uint16)
    tokenizer_size = Tokenizer.from_file(str(require(args.tokenizer, "recipes/word_problems/train_tokenizer.py"))
                                         ).get_vocab_size()
    vocab_size = -(-tokenizer_size // 8) * 8  # rounded up to a multiple of 8: spare rows, the first is the mask
    if args.init_from is not None:
        model = Qwen3.from_pretrained(require(args.init_from / "config.json", "an earlier train_target.py run").parent)
        model.requires_grad_(True).train()  # loaded for inference: make it trainable again
    else:
        model = build_model(vocab_size, args)
    optimizer = make_optimizer(model, args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    heldout = random_windows(heldout_tokens, 32, args.seq_len, torch.Generator().manual_seed(1234))
    state_path = args.work / "target_state.pt"
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, vocab {vocab_size}; "
          f"train {len(train):,} tokens, held-out {len(heldout_tokens):,}")

    step, log, total = 0, [], args.steps
    if args.resume:
        state = load_training_state(state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step, total, log = state["step"], state["total"], json.loads(state["log"])
    started, elapsed_before = time.time(), (log[-1]["elapsed"] if log else 0.0)
    budget = args.minutes * 60

    def fraction_done(step: int, elapsed: float) -> float:
        """Where the schedule stands: by steps with --steps, else by time (speed varies on shared CPUs)."""
        return step / total if total else elapsed / budget

    last_save = time.time()
    progress = tqdm(total=total or round(budget), initial=step if total else round(elapsed_before),
                    desc="target", unit="step" if total else "s")
    elapsed = elapsed_before
    while fraction_done(step, elapsed) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(fraction_done(step, elapsed), args.lr, args.warmup)
        loss = next_token_loss(model, random_windows(train, args.batch_size, args.seq_len, generator))
        optimizer_step(loss, model, optimizer, grad_clip=1.0)
        step += 1
        previous, elapsed = elapsed, elapsed_before + time.time() - started
        entry = {"step": step, "train_loss": loss.item(), "elapsed": elapsed}
        if step % args.eval_every == 0:
            entry["heldout_loss"] = heldout_loss(model, heldout)
        log.append(entry)
        progress.update(1 if total else round(elapsed) - round(previous))
        tokens_per_second = step * args.batch_size * args.seq_len / elapsed
        progress.set_postfix(step=step, loss=f"{loss.item():.3f}", heldout=f"{log_heldout(log):.3f}",
                             tok_s=f"{tokens_per_second:,.0f}")
        if time.time() - last_save > 300:
            save_state(state_path, model, optimizer, step, total, generator, log)
            last_save = time.time()
    progress.close()
    log[-1]["heldout_loss"] = heldout_loss(model, heldout)
    save_state(state_path, model, optimizer, step, total, generator, log)
    model.save_pretrained(args.out, dtype=torch.float32)
    write_json_atomically(args.work / "target_log.json", log)
    print(f"saved {args.out}: held-out loss {log_heldout(log):.3f} after {step} steps, "
          f"{log[-1]['elapsed'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
