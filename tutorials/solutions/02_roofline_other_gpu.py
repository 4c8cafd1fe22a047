"""Notebook 2, exercise 1: the roofline time of a Qwen3-8B pass on an A100, against the H100.

Run from tutorials/: python solutions/02_roofline_other_gpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.qwen3 import Qwen3, Qwen3Config

# Published datasheet figures (a model, not a measurement): memory bandwidth, dense bf16 tensor-core FLOP/s.
H100 = dict(name="NVIDIA H100 SXM", bandwidth=3.35e12, flops=989e12)
A100 = dict(name="NVIDIA A100 SXM 80GB", bandwidth=2.039e12, flops=312e12)
CONTEXT = 2048  # tokens already in the KV cache, as in the notebook

config = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
with torch.device("meta"):  # shapes only, no memory
    model = Qwen3(config)
total = sum(p.numel() for p in model.parameters())
matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # LM head included
other = total - matmul - model.embed_tokens.weight.numel()  # the norms
kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim  # keys + values


def bytes_read(tokens, context=CONTEXT, bytes_per_number=2):
    weights = matmul + other + tokens * config.hidden_size  # every weight once, the embedding rows used
    return bytes_per_number * (weights + kv_per_token * (context + tokens))  # ... and the whole KV cache


def flops(tokens, context=CONTEXT):
    keys_seen = tokens * context + tokens * (tokens + 1) / 2  # cached keys, then causal within the new tokens
    attention = 2 * 2 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * keys_seen
    return 2 * matmul * tokens + attention


def pass_ms(gpu, k):
    """The roofline time of one pass over k new tokens: the slower of reading and computing."""
    return 1e3 * max(bytes_read(k) / gpu["bandwidth"], flops(k) / gpu["flops"])


def flat_until(gpu, limit=1.10):
    """The largest k (1..1024) whose pass costs at most `limit` times a one-token pass."""
    return max(k for k in range(1, 1025) if pass_ms(gpu, k) <= limit * pass_ms(gpu, 1))


for gpu in (H100, A100):
    ridge = gpu["flops"] / gpu["bandwidth"]
    print(f"{gpu['name']}: {pass_ms(gpu, 1):.2f} ms a one-token pass, {pass_ms(gpu, 16):.2f} ms for 16 tokens; "
          f"flat (within 10 %) up to k = {flat_until(gpu)}; ridge {ridge:.0f} FLOP/byte")

assert pass_ms(A100, 1) > pass_ms(H100, 1), "the A100 reads memory more slowly, so every pass takes longer"
assert flat_until(A100) < flat_until(H100), "fewer FLOPs per byte read: the A100's pass stops being flat sooner"
assert pass_ms(A100, 16) < 1.01 * pass_ms(A100, 1), "on the A100 too, verifying 16 tokens costs about one token"
# The flat stretch ends near the ridge: compute time (2 * matmul * k / FLOP/s) catches up with the read time.
for gpu in (H100, A100):
    assert 0.5 * gpu["flops"] / gpu["bandwidth"] < flat_until(gpu) < 2 * gpu["flops"] / gpu["bandwidth"]
print("checks passed")
