"""Grades lab 01_gqa: against the project's attention (SDPA with enable_gqa under the causal mask) at two
groupings, with every call that copies or expands keys and values switched off while the student's runs."""

import torch
import torch.nn.functional as F

import dflash.qwen3
from _lab_helpers import drawn_generator, forbidden
from dflash.qwen3 import causal_mask, masked

NO_COPIES = {
    torch: ["repeat_interleave", "cat", "concat", "concatenate", "stack", "tile", "broadcast_to", "index_select"],
    torch.Tensor: ["repeat_interleave", "repeat", "tile", "expand", "expand_as", "index_select", "clone"],
    F: ["scaled_dot_product_attention"],
    dflash.qwen3: ["masked"],
}
RULE = "01_gqa: the lab asks for attention without copying the keys and values (let broadcasting do it)"


def drawn_shapes(generator: torch.Generator) -> list[tuple[int, ...]]:
    """(batch, heads, kv_heads, seq, head_dim) at three groupings, sizes drawn at run time."""

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    return (
        [(draw(1, 3), 2 * kv, kv, draw(2, 9), 32) for kv in (draw(1, 4),)]
        + [(1, 4 * kv, kv, draw(2, 9), 128) for kv in (draw(2, 8),)]
        + [(1, draw(2, 6), 1, draw(2, 9), 16)]
    )


def test_gqa(lab):
    generator = drawn_generator()
    for batch, heads, kv_heads, seq, d in drawn_shapes(generator):
        q = torch.randn(batch, heads, seq, d, generator=generator)  # (batch, heads, seq, head_dim)
        # (batch, kv_heads, seq, d)
        k, v = torch.randn(2, batch, kv_heads, seq, d, generator=generator).unbind(0)
        expected = masked(causal_mask(torch.arange(seq), num_keys=seq))(q, k, v)  # (batch, heads, seq, head_dim)
        with forbidden(lab, RULE, NO_COPIES):
            mine = lab.my_grouped_attention(q, k, v)
        assert mine.shape == expected.shape, (
            f"01_gqa: shape {tuple(mine.shape)} for q of shape {tuple(q.shape)}: (batch, heads, "
            "seq, head_dim)"
        )
        assert torch.allclose(mine, expected, atol=1e-5), \
            f"01_gqa: differs from masked causal attention for {heads} query heads on {kv_heads} key/value heads"
