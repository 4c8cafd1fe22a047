"""Benchmark: peak memory while loading a large bf16 checkpoint, relative to its size on disk.

    python benchmarks/bench_load.py --hidden 2048 --layers 16

Writes a synthetic Qwen3 checkpoint in the official layout (random bf16 weights,
optionally sharded) into a temporary folder, then loads it in a fresh process with
`Qwen3.from_pretrained(..., dtype=torch.bfloat16)` and reports the growth of that
process's peak resident memory (after importing torch, and after reading every
weight once so that memory-mapped pages count) divided by the bytes of the
safetensors files. Building on the `meta` device and assigning each tensor as it
is read is what keeps the ratio near 1: the model never exists twice.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench_common import peak_memory, reset_peak_memory
from dflash.cli import OneLineErrors, UsageError, positive_int, run_cli
from dflash.qwen3 import Qwen3, Qwen3Config, official_names
from dflash.training import init_weights

CPU = torch.device("cpu")


def measure(folder: str) -> None:
    """In a fresh process: the peak's growth while loading `folder`, and the bytes of the loaded weights."""
    reset_peak_memory(CPU)  # the peak is now what the process holds: torch and the project imported
    before = peak_memory(CPU)
    model = Qwen3.from_pretrained(folder, dtype=torch.bfloat16)
    sum(float(p.sum()) for p in model.parameters())  # fault in every page, as a forward would
    print(before, peak_memory(CPU), sum(p.numel() * p.element_size() for p in model.parameters()))


def write_synthetic_checkpoint(folder: Path, config: Qwen3Config, shards: int) -> int:
    """Random bf16 weights in the official names, split across `shards` files; returns bytes written."""
    from safetensors.torch import save_file

    with torch.device("meta"):
        model = Qwen3(config).to(torch.bfloat16)
    model = init_weights(model.to_empty(device=CPU))  # the bf16 model, once: no float32 copy
    names = official_names(model)
    order = list(names)
    per_shard = -(-len(order) // shards)  # ceiling division
    weight_map, total = {}, 0
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        tensors = {name: model.get_parameter(names[name]).detach()
                   for name in order[index * per_shard:(index + 1) * per_shard]}
        save_file(tensors, folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += (folder / file).stat().st_size
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({**config.to_dict(), "dtype": "bfloat16"}))
    return total


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=positive_int, default=2048)
    parser.add_argument("--layers", type=positive_int, default=16)
    parser.add_argument("--vocab", type=positive_int, default=32768)
    parser.add_argument("--shards", type=positive_int, default=1)
    parser.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)  # internal: load DIR, print the memory
    return parser


def run(args) -> int:
    if args.measure:
        measure(args.measure)
        return 0
    if args.shards > args.layers:
        raise UsageError(f"--shards {args.shards}: more files than the {args.layers} layers to split")
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, tie_word_embeddings=False)
    with tempfile.TemporaryDirectory() as tmp:
        on_disk = write_synthetic_checkpoint(Path(tmp), config, args.shards)
        result = subprocess.run([sys.executable, __file__, "--measure", tmp], capture_output=True, text=True,
                                check=True)
    before, peak, in_model = map(int, result.stdout.split())
    growth = peak - before
    print(f"checkpoint on disk: {on_disk / 2**30:.2f} GiB in {args.shards} file(s), bf16")
    print(f"model in memory:    {in_model / 2**30:.2f} GiB")
    print(f"peak RSS growth:    {growth / 2**30:.2f} GiB  ->  {growth / on_disk:.2f}x the size on disk")
    return 0


def main(argv=None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
