"""Grades lab 04_anchor_leak against train.py's AnchoredBlocks: the leaky mask adds, in block j's rows, exactly
the context columns a_j .. a_j + extra - 1 (inside the context) and takes nothing away; and its `attend`, the
way training reads it, computes what the dense mask says."""

import torch

from _lab_helpers import drawn_generator
from dflash.qwen3 import masked
from dflash.train_kernels import AnchoredBlocks

CONTEXT, BLOCK = 30, 4


def test_anchor_leak(lab):
    generator = drawn_generator()
    anchors = torch.stack([torch.randperm(CONTEXT - 1, generator=generator)[:5].sort().values
                           for _ in range(2)])  # (batch 2, K 5)
    anchors[1, -1] = CONTEXT - 1  # a block anchored at the last position: a leak there runs out of context
    strict = AnchoredBlocks(anchors, CONTEXT, BLOCK).dense_mask()  # (batch, 1, K*B, S + K*B)
    for extra in (0, 1, int(torch.randint(2, BLOCK, (1,), generator=generator)), BLOCK):
        pattern = lab.leaky_pattern(anchors, CONTEXT, BLOCK, extra)
        leaky = pattern.dense_mask()
        assert leaky.shape == strict.shape, \
            f"04_anchor_leak: mask shape {tuple(leaky.shape)}, not {tuple(strict.shape)}"
        assert not (strict & ~leaky).any(), f"04_anchor_leak: extra={extra} hides something the strict pattern shows"
        added = leaky & ~strict
        for row in range(2):
            for j, anchor in enumerate(anchors[row].tolist()):
                rows = added[row, 0, j * BLOCK:(j + 1) * BLOCK]  # (B, S + K*B): block j's additions
                wanted = list(range(anchor, min(anchor + extra, CONTEXT)))
                for slot in rows:
                    more = slot.nonzero()[:, 0].tolist()
                    assert more == wanted, (
                        f"04_anchor_leak: with extra={extra}, the block anchored at {anchor} sees "
                        f"{len(more)} context "
                        "positions more than train.py's pattern, starting at "
                        f"{more[0] if more else None}: it should "
                        f"see the extra positions from its anchor on, none past the context"
                    )
        q = torch.randn(2, 4, 5 * BLOCK, 8, generator=generator)  # (batch, heads, K*B, d)
        k, v = torch.randn(2, 2, 2, CONTEXT + 5 * BLOCK, 8, generator=generator).unbind(0)  # (batch, kv, S + K*B, d)
        assert torch.allclose(pattern.attend(q, k, v), masked(leaky)(q, k, v), atol=1e-5), \
            "04_anchor_leak: the pattern's attend (what training calls) disagrees with its dense mask"
