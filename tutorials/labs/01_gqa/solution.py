"""Lab 01_gqa, the reference answer (notebook 1, section 4): grouped-query attention without copying keys and values."""

import math

import torch


def my_grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (batch, heads, seq, d), k and v (batch, kv_heads, seq, d) -> (batch, heads, seq, d), causal.

    Query head h belongs to key/value head h // groups: viewing the heads as (kv_heads, groups)
    puts each group next to its key/value head, and broadcasting over the groups axis reads every
    key and value as it is, never copied by this code.
    """
    batch, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.view(batch, kv_heads, heads // kv_heads, seq, d)  # (batch, kv_heads, groups, seq, d)
    scores = grouped @ k[:, :, None].transpose(-1, -2) / math.sqrt(d)  # (batch, kv_heads, groups, seq, keys)
    may_look = torch.ones(seq, seq, dtype=torch.bool).tril()  # (seq, keys): the causal mask
    weights = scores.masked_fill(~may_look, float("-inf")).softmax(dim=-1)  # (batch, kv_heads, groups, seq, keys)
    return (weights @ v[:, :, None]).reshape(batch, heads, seq, d)  # (batch, kv_heads, groups, seq, d) -> heads
