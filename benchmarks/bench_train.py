"""Benchmark: one drafter training step, peak memory and speed, dense path against the fast one.

    python benchmarks/bench_train.py --shape qwen3-0.6b --seq-len 512 --anchors 32 --steps 3
    python benchmarks/bench_train.py --project          # the formula only: Qwen3-4B/8B at the paper's settings

The target and drafter have a real Qwen3 shape and random weights (memory and time
do not depend on what the weights say). Each path runs in a fresh process, so that
one path's peak does not hide the other's:

- `dense`: the attention under a dense (K*B) x (S + K*B) mask, and the LM-head loss
  over all scored slots at once (logits, softmax and their gradient all kept);
- `fast-keep`: `AnchoredBlocks` (masked regions skipped) and the chunked loss
  (`dflash/train_kernels.py`), every drafter layer's activations kept for the backward;
- `fast`: the same, each drafter layer recomputed in the backward pass instead
  (`Drafter.recompute_layers`, train.py's default).

After one warm-up step (which allocates the gradients and AdamW's moments), memory is
the growth of the process's peak over `--steps` more steps: resident memory on CPU
(VmHWM, reset after the warm-up), `max_memory_allocated` on CUDA. Speed is their
median step time, in target tokens per second.

`--project` prints the peak per GPU that `projected_peak_bytes` predicts at the paper's
settings (bf16 target, float32 drafter with AdamW, bf16 activations), itemised; the
benchmark prints the same formula's prediction next to each measurement, which is
how the formula is checked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import train
from bench_common import (check_report_output, peak_memory, print_table,
                          reset_peak_memory, write_report)
from dflash.cli import OneLineErrors, UsageError, run_cli
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.training import init_weights, optimizer_step

# The official configs' shapes (config.json of each released checkpoint); the last one
# is the test's: Qwen3's vocabulary on a model small enough for a CI machine.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "tiny-vocab-151936": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}
VOCAB = 151936
PATHS = ("dense", "fast-keep", "fast")
PAPER = dict(batch=4, seq_len=3072, anchors=512, block_size=16, drafter_layers=5, loss_chunk_size=512)


def target_config(shape: str) -> Qwen3Config:
    return Qwen3Config(vocab_size=VOCAB, max_position_embeddings=40960, rope_theta=1e6, **SHAPES[shape])


# --------------------------------------------------------------------- the projection


def projected_peak_bytes(shape: str, batch: int, seq_len: int, anchors: int, block_size: int,
                         drafter_layers: int, loss_chunk_size: int, activation_bytes: int = 2,
                         target_bytes: int = 2, recompute: bool = True) -> dict[str, float]:
    """Peak memory of one fast-path training step, per process, itemised (bytes). `batch` is train.py's
    --batch-size, the sequences of one forward pass: with --grad-accum N a step runs N such passes before its
    update, at the same peak (each pass's activations are freed by its backward; the gradients, counted once,
    accumulate in place), and a step's global batch is batch x processes x N sequences.

    Counted from what the code keeps alive at the peak (the start of the backward pass):
    - the frozen target's weights, in its dtype;
    - the drafter's float32 weights, gradients and AdamW's two moments: 4 + 12 bytes each;
    - the target's features (the captured layers, concatenated) for every context row;
    - per drafter layer, what autograd saves: for each of the Q = batch*K*B block rows
      its residual input and post-attention residual (float32, for the norms), the
      normed inputs of the projections, queries, attention output, and the MLP's gate,
      up, activation and product; for each of the C = batch*S context rows the keys
      and values (their norms' inputs too); with `recompute` (train.py's default) only
      each layer's input is kept, plus one layer's worth while it is recomputed;
    - the loss: one chunk of float32 logits (the softmax runs in place), plus the
      matmul's output in the activation dtype, plus the block rows' hidden states and
      their gradient in float32.
    The attention itself keeps no score matrix (fused kernels, per chunk of blocks).
    """
    c = target_config(shape)
    h, inter, heads, kv, d = (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                              c.head_dim)
    embedding = VOCAB * h
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter + 2 * d + 2 * h  # attention, MLP, norms
    target_params = embedding * (1 if c.tie_word_embeddings else 2) + c.num_hidden_layers * per_layer + h
    captured = min(drafter_layers, c.num_hidden_layers)
    drafter_params = captured * h * h + drafter_layers * per_layer + 2 * h
    query_rows, context_rows = batch * anchors * block_size, batch * seq_len
    a = activation_bytes
    per_query_row = 2 * 4 * h + 2 * a * h + a * (2 * heads * d + 2 * kv * d) + 4 * a * inter  # per drafter layer
    per_context_row = a * (2 * kv * d) * 2  # keys and values, and their pre-norm / pre-rope copies
    return {
        "target weights": target_params * target_bytes,
        "drafter weights": drafter_params * 4,
        "drafter grads, AdamW": drafter_params * 12,
        "target features": context_rows * captured * h * a + context_rows * h * 4,
        "drafter activations": (drafter_layers * query_rows * 4 * h + query_rows * per_query_row
                                + context_rows * per_context_row) if recompute else
                               drafter_layers * (query_rows * per_query_row + context_rows * per_context_row),
        "loss chunk": loss_chunk_size * VOCAB * (4 + a) + query_rows * h * 4 * 2,
    }


def print_projection(batches: tuple[int, ...] = (1, 2, 4)) -> None:
    """The formula at the paper's settings, for the two target sizes the paper trains drafters for."""
    settings = {k: v for k, v in PAPER.items() if k != "batch"}
    print(f"projected peak per GPU, fast path, paper settings {settings} (bf16 target and activations; batch:\n"
          f"sequences per forward pass, --batch-size; --grad-accum adds passes per step, not memory):")
    for shape in ("qwen3-4b", "qwen3-8b"):
        for batch in batches:
            parts = projected_peak_bytes(shape, batch=batch, **settings)
            items = ", ".join(f"{name} {value / 2**30:.1f}" for name, value in parts.items())
            print(f"  {shape} batch {batch}: {sum(parts.values()) / 2**30:.1f} GiB  ({items})")


# ------------------------------------------------------------------------ one process


def measure_one(args: argparse.Namespace) -> dict:
    """Build the pair, run `--steps` training steps on one path, return its peak and speed."""
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        target = train.freeze(init_weights(Qwen3(target_config(args.shape))).to(dtype))
    cfg = train.TrainConfig(drafter_layers=args.drafter_layers, block_size=args.block_size)
    config = train.build_drafter_config(cfg, target.config, None)
    drafter = init_weights(Drafter(config)).to(device).train()
    drafter.recompute_layers = args.one == "fast"  # "fast-keep": the fast kernels, activations kept
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (args.batch, args.seq_len), generator=generator).to(device)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, : args.seq_len // 8] = 0  # a prompt, then the answer
    weights = train.slot_weights(args.block_size, train.gamma_for_block_size(args.block_size))
    dense = args.one == "dense"
    times = []
    for step in range(args.steps + 1):  # one warm-up step first: it allocates AdamW's moments and the gradients
        if step == 1:
            reset_peak_memory(device)  # the peak is now what the process holds
            before = peak_memory(device)
        anchors, real = train.batch_anchors(loss_mask, args.anchors, [generator] * args.batch)
        started = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            features = train.target_features(target, input_ids, config)  # (batch, S, layers * hidden)
            batch = train.MicroBatch(input_ids, loss_mask, anchors, real)
            loss, _, _ = train.drafter_loss(target, drafter, features, batch, config=config,
                                            weights=weights, loss_chunk_size=0 if dense else args.loss_chunk_size,
                                            dense_attention=dense)
        optimizer_step(loss, drafter, optimizer, grad_clip=1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    step_seconds = statistics.median(times[1:])
    return {"path": args.one, "shape": args.shape, "device": device.type,
            "peak_step_mb": (peak_memory(device) - before) / 2**20,
            "step_seconds": step_seconds, "tokens_per_second": args.batch * args.seq_len / step_seconds,
            "loss": loss.item()}


# ------------------------------------------------------------------------ the report


def run_path(args: argparse.Namespace, path: str) -> dict:
    """One path in a fresh process (`--one`), its JSON line parsed."""
    command = [sys.executable, __file__, "--one", path] + [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("shape", "batch", "seq_len", "anchors", "block_size", "drafter_layers", "loss_chunk_size",
                     "steps")]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UsageError(f"the {path} path failed: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace) -> int:
    rows = [run_path(args, path) for path in args.paths]
    steady = ("target weights", "drafter weights", "drafter grads, AdamW")  # there before the measured steps
    predicted = {}
    for path, recompute in (("fast-keep", False), ("fast", True)):
        parts = projected_peak_bytes(args.shape, args.batch, args.seq_len, args.anchors, args.block_size,
                                     args.drafter_layers, args.loss_chunk_size, activation_bytes=4, target_bytes=4,
                                     recompute=recompute)
        predicted[path] = (sum(parts.values()) - sum(parts[name] for name in steady)) / 2**20
    print_table(f"{args.shape}, batch {args.batch} x {args.seq_len} tokens, {args.anchors} anchors x "
                f"{args.block_size}, {args.drafter_layers} drafter layers, loss chunk {args.loss_chunk_size}, "
                f"{args.steps} steps on {rows[0]['device']} ({torch.get_num_threads()} threads)",
                [("path", "s"), ("peak growth, MB", ".0f"), ("step, s", ".2f"), ("tokens/s", ".1f")],
                [[row["path"], row["peak_step_mb"], row["step_seconds"], row["tokens_per_second"]] for row in rows])
    dense = next((r for r in rows if r["path"] == "dense"), None)
    for row in rows:
        if dense and row is not dense:
            print(f"{row['path']}: {dense['peak_step_mb'] / row['peak_step_mb']:.1f}x less peak memory than dense, "
                  f"{dense['step_seconds'] / row['step_seconds']:.2f}x its speed")
    print("the formula predicts a growth of " + ", ".join(f"{mb:.0f} MB for {path}" for path, mb in predicted.items())
          + " (float32: activations and loss)")
    if args.json:
        write_report(Path(args.json), {"rows": rows, "predicted_growth_mb": predicted})
    print_projection()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--drafter-layers", type=int, default=5)
    parser.add_argument("--loss-chunk-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2, help="measured steps, after one warm-up step")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--json", help="also write the measurements here")
    parser.add_argument("--project", action="store_true", help="print the projection only")
    parser.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)  # internal: one path, JSON out
    return parser


def main(args: argparse.Namespace) -> int:
    for name in ("batch", "seq_len", "anchors", "block_size", "drafter_layers", "steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    check_report_output(args.json, "--json", {})  # before the runs: random weights, no input
    if args.project:
        print_projection()
        return 0
    if args.one:
        print(json.dumps(measure_one(args)))
        return 0
    return report(args)


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
