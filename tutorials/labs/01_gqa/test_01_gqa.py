"""Grades lab 01_gqa: against the project's attention (SDPA with enable_gqa under the causal mask) at two
groupings, with every call that copies or expands keys and values switched off while the student's runs."""

import torch
import torch.nn.functional as F

import dflash.qwen3
from _lab_helpers import switched_off
from dflash.qwen3 import causal_mask, masked

NO_COPIES = {
    torch: ["repeat_interleave", "cat", "concat", "concatenate", "stack", "tile", "broadcast_to", "index_select"],
    torch.Tensor: ["repeat_interleave", "repeat", "tile", "expand", "expand_as", "index_select", "clone"],
    F: ["scaled_dot_product_attention"],
    dflash.qwen3: ["masked"],
}
RULE = "01_gqa: the lab asks for attention without copying the keys and values (let broadcasting do it)"


def test_gqa(lab):
    torch.manual_seed(0)
    for batch, heads, kv_heads, seq, d in [(2, 4, 2, 7, 32), (1, 32, 8, 5, 128), (1, 6, 1, 4, 16)]:
        q = torch.randn(batch, heads, seq, d)  # (batch, heads, seq, head_dim)
        k, v = torch.randn(2, batch, kv_heads, seq, d).unbind(0)  # (batch, kv_heads, seq, head_dim) each
        expected = masked(causal_mask(torch.arange(seq), num_keys=seq))(q, k, v)  # (batch, heads, seq, head_dim)
        with switched_off(RULE, NO_COPIES):
            mine = lab.my_grouped_attention(q, k, v)
        assert mine.shape == expected.shape, f"01_gqa: shape {tuple(mine.shape)}, expected {tuple(expected.shape)}"
        assert torch.allclose(mine, expected, atol=1e-5), \
            f"01_gqa: differs from masked causal attention for {heads} query heads on {kv_heads} key/value heads"
