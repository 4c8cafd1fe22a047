"""Notebook 1, exercise 3: grouped-query attention without repeating keys and values.

Run from tutorials/: python solutions/01_gqa.py
"""

import json
import math
import sys
from pathlib import Path

ROOT = Path.cwd().parent  # run from tutorials/, as the notebooks are
sys.path.insert(0, str(ROOT))

import torch

from dflash.qwen3 import Qwen3Config, causal_mask, masked


def my_grouped_attention(q, k, v):
    """q (batch, heads, seq, d), k and v (batch, kv_heads, seq, d) -> (batch, heads, seq, d), causal.

    Query head h belongs to key/value head h // groups: viewing the heads as
    (kv_heads, groups) puts each group next to its key/value head, and broadcasting
    over the groups axis reads every key and value once, never copied.
    """
    batch, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.view(batch, kv_heads, heads // kv_heads, seq, d)  # (batch, kv_heads, groups, seq, d)
    scores = grouped @ k[:, :, None].transpose(-1, -2) / math.sqrt(d)  # (batch, kv_heads, groups, seq, keys)
    may_look = torch.ones(seq, seq, dtype=torch.bool).tril()  # (seq, keys): the causal mask
    weights = scores.masked_fill(~may_look, float("-inf")).softmax(dim=-1)  # (batch, kv_heads, groups, seq, keys)
    return (weights @ v[:, :, None]).reshape(batch, heads, seq, d)  # (batch, kv_heads, groups, seq, d) -> heads


torch.manual_seed(0)
config = Qwen3Config.from_dict(json.loads((ROOT / "weights/tiny-qwen3/config.json").read_text()))
q = torch.randn(2, config.num_attention_heads, 7, config.head_dim)  # (batch, heads, seq, head_dim)
k, v = torch.randn(2, 2, config.num_key_value_heads, 7, config.head_dim).unbind(0)  # (batch, kv_heads, seq, d) each
expected = masked(causal_mask(torch.arange(7), num_keys=7))(q, k, v)  # (batch, heads, seq, head_dim)
assert torch.allclose(my_grouped_attention(q, k, v), expected, atol=1e-5)

# Qwen3-8B's grouping too: 32 query heads on 8 key/value heads.
q = torch.randn(1, 32, 5, 128)  # (batch, heads, seq, head_dim)
k, v = torch.randn(2, 1, 8, 5, 128).unbind(0)  # (batch, kv_heads, seq, head_dim) each
assert torch.allclose(my_grouped_attention(q, k, v), masked(causal_mask(torch.arange(5), 5))(q, k, v), atol=1e-5)
print("exercise 3: solved")
