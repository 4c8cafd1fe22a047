"""dflash/train_kernels.py: the chunked loss and the block-skipping attention equal the dense ones,
values and gradients, and a training step at Qwen3's vocabulary stays within a stated memory."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.train_kernels import AnchoredBlocks, chunked_lm_head_loss

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"


# ------------------------------------------------------------------ the chunked loss


def dense_weighted_loss(hidden, head, labels, weights):
    """The textbook way: all logits, cross-entropy, weighted sum."""
    return (weights * F.cross_entropy(hidden @ head.T, labels, reduction="none")).sum()


@pytest.mark.parametrize("chunk_size", [1, 7, 50, 1000])
def test_chunked_loss_equals_dense_values_and_gradients(chunk_size):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, generator=generator, dtype=torch.float64, requires_grad=True)
    head = torch.randn(97, 16, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 97, (50,), generator=generator)
    weights = torch.rand(50, generator=generator, dtype=torch.float64)
    weights = weights / weights.sum()
    expected = dense_weighted_loss(hidden, head, labels, weights)
    (expected_grad,) = torch.autograd.grad(3.0 * expected, hidden)  # an upstream factor, as a caller may scale
    loss, hits = chunked_lm_head_loss(hidden, head, labels, weights, chunk_size)
    (grad,) = torch.autograd.grad(3.0 * loss, hidden)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)  # the running sum is float32
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)
    assert torch.equal(hits, (hidden @ head.T).argmax(-1) == labels)


def test_chunked_loss_without_grad_and_refusing_a_trainable_head():
    hidden, head = torch.randn(9, 4), torch.randn(11, 4)
    labels, weights = torch.randint(0, 11, (9,)), torch.full((9,), 1 / 9)
    with torch.no_grad():
        loss, _ = chunked_lm_head_loss(hidden, head, labels, weights, 4)
    torch.testing.assert_close(loss, dense_weighted_loss(hidden, head, labels, weights))
    with pytest.raises(ValueError, match="frozen"):
        chunked_lm_head_loss(hidden, head.requires_grad_(), labels, weights, 4)


# ------------------------------------------------------------- the block attention


def anchored_pattern(context, block, count, seed, blocks_per_chunk=16):
    """Two rows of sorted anchors in 1..context-1, the second's last count // 2 blocks padding at 0 (as batch_anchors
    pads)."""
    generator = torch.Generator().manual_seed(seed)
    real = count - count // 2
    rows = [torch.randint(1, context, (count,), generator=generator).sort().values,
            torch.cat([torch.randint(1, context, (real,), generator=generator).sort().values,
                       torch.zeros(count - real, dtype=torch.long)])]
    return AnchoredBlocks(torch.stack(rows), context, block, blocks_per_chunk)


def random_pattern(seed, blocks_per_chunk):
    """The chunked attention's small case: 7 blocks of 4 over a context of 40."""
    return anchored_pattern(40, 4, 7, seed, blocks_per_chunk)


def random_qkv(pattern, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    queries = pattern.anchors.shape[1] * pattern.block_size
    q = torch.randn(2, 4, queries, 8, generator=generator, dtype=dtype)  # 4 query heads ...
    k = torch.randn(2, 2, pattern.context_length + queries, 8, generator=generator, dtype=dtype)  # ... 2 kv heads
    v = torch.randn(2, 2, pattern.context_length + queries, 8, generator=generator, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def dense_attention(pattern, q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=pattern.dense_mask(), enable_gqa=True)


def values_and_gradients(attend, q, k, v):
    out = attend(q, k, v)
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum(),
                                (q, k, v))
    return out, grads


@pytest.mark.parametrize("blocks_per_chunk", [1, 3, 16])
def test_block_attention_in_chunks_equals_dense(blocks_per_chunk):
    pattern = random_pattern(0, blocks_per_chunk)
    q, k, v = random_qkv(pattern)
    expected, expected_grads = values_and_gradients(lambda *t: dense_attention(pattern, *t), q, k, v)
    out, grads = values_and_gradients(pattern.attend_in_chunks, q, k, v)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_is_the_same_pattern():
    """The mask_mod FlexAttention runs on CUDA, checked here in its uncompiled reference mode.

    FlexAttention has no backward on CPU: the values are compared here, the gradients
    on a GPU by benchmarks/gpu_check.py.
    """
    from torch.nn.attention.flex_attention import flex_attention

    pattern = random_pattern(2, 16)
    q, k, v = (t.detach() for t in random_qkv(pattern, torch.float32))
    block_mask = pattern.flex_block_mask(q.shape[2], k.shape[2], "cpu")
    expected = dense_attention(pattern, q, k, v)
    out = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------ the whole training loss


def training_batch(*, block_size: int, loss_mask: torch.Tensor, anchors: int, seed: int):
    """The tiny target, a fresh 2-layer drafter for it, and a batch of random ids shaped like `loss_mask` with its
    anchors: (target, drafter, config, ids, anchors, real)."""
    target = train.freeze(Qwen3.from_pretrained(TINY))
    config = train.build_drafter_config(train.TrainConfig(drafter_layers=2, block_size=block_size), target.config, None)
    drafter = Drafter(config)
    train.init_drafter(drafter, 0)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 500, tuple(loss_mask.shape), generator=generator)
    chosen, real = train.batch_anchors(loss_mask, anchors, [generator] * loss_mask.shape[0])
    return target, drafter, config, ids, chosen, real


def test_drafter_loss_fast_path_equals_dense_path():
    """train.drafter_loss with the three replacements (block attention, chunked loss, recomputed layers)
    gives the dense path's loss, hit counts and gradients."""
    loss_mask = torch.tensor([[0] * 6 + [1] * 24, [0] * 10 + [1] * 16 + [0] * 4])
    target, drafter, config, ids, anchors, real = training_batch(block_size=4, loss_mask=loss_mask, anchors=5, seed=3)
    weights = train.slot_weights(4, 2.0)
    results = []
    for chunk, dense in [(0, True), (7, False)]:
        drafter.zero_grad()
        drafter.recompute_layers = not dense  # the fast path also recomputes each layer in the backward
        batch, features = train.MicroBatch(ids, loss_mask, anchors, real), train.target_features(target, ids, config)
        loss, correct, counted = train.drafter_loss(target, drafter, features, batch, config=config,
                                                    weights=weights, loss_chunk_size=chunk, dense_attention=dense)
        loss.backward()
        results.append((loss.detach(), correct, counted, [p.grad.clone() for p in drafter.parameters()]))
    (dense_loss, *dense_counts, dense_grads), (loss, *counts, grads) = results
    torch.testing.assert_close(loss, dense_loss)
    assert all(torch.equal(a, b) for a, b in zip(counts, dense_counts))
    for grad, dense_grad in zip(grads, dense_grads):
        torch.testing.assert_close(grad, dense_grad, atol=1e-6, rtol=1e-4)


@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def test_drafter_loss_through_compiled_flex_attention_equals_dense(monkeypatch):
    """The training forward as a GPU runs it, every drafter layer through `attend_flex` (one block mask shared),
    compiled by inductor on the CPU (static shapes, forward only: see the FlexAttention tests above), gives the dense
    path's loss: blocks of 10 over 3 query tiles, context 256."""
    loss_mask = torch.tensor([[0] * 20 + [1] * 236, [0] * 100 + [1] * 120 + [0] * 36])
    target, drafter, config, ids, anchors, real = training_batch(block_size=10, loss_mask=loss_mask, anchors=30, seed=5)
    weights = train.slot_weights(10, 5.0)
    with torch.no_grad():
        batch, features = train.MicroBatch(ids, loss_mask, anchors, real), train.target_features(target, ids, config)
        dense_loss, *_ = train.drafter_loss(target, drafter, features, batch, config=config,
                                            weights=weights, dense_attention=True)
        monkeypatch.setattr(AnchoredBlocks, "attend", AnchoredBlocks.attend_flex)  # what `attend` picks on CUDA
        loss, *_ = train.drafter_loss(target, drafter, features, batch, config=config, weights=weights)
    torch.testing.assert_close(loss, dense_loss, atol=1e-6, rtol=1e-6)


def test_target_features_stop_at_the_last_layer_read():
    target = Qwen3.from_pretrained(TINY)
    ids = torch.randint(0, 500, (1, 9), generator=torch.Generator().manual_seed(0))
    _, full = target(ids, capture_layers=[1, 0])
    calls = []
    hooks = [layer.register_forward_hook(lambda *_: calls.append(1)) for layer in target.layers]
    _, features = target(ids, capture_layers=[1, 0], last_layer=1)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(features, full)
    assert len(calls) == 2 < target.config.num_hidden_layers


# ------------------------------------------------------------------- peak memory


MEMORY_PROBE = ROOT / "benchmarks" / "bench_train.py"


@pytest.mark.parametrize("path, limit_mb", [("fast", 400)])
def test_training_step_at_qwen3_vocabulary_stays_under_stated_memory(path, limit_mb):
    """128 anchors x 16 slots (2,048 slots, nearly all scored) at vocabulary 151,936, hidden 64.

    The dense loss alone would hold 2,048 x 151,936 float32 logits three times over
    (logits, log-softmax kept for backward, their gradient): about 3.7 GB. The fast
    path's peak growth over the step must stay under `limit_mb`; the dense path is
    measured too, so that the probe is seen to measure something.
    """
    peaks = {}
    for name in (path, "dense"):
        command = [sys.executable, str(MEMORY_PROBE), "--shape", "tiny-vocab-151936", "--seq-len", "256",
                   "--anchors", "128", "--steps", "1", "--one", name, "--loss-chunk-size", "256", "--drafter-layers", "1"]
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                                env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, result.stderr[-2000:]
        peaks[name] = json.loads(result.stdout.strip().splitlines()[-1])["peak_step_mb"]
    assert peaks[path] < limit_mb, peaks
    assert peaks["dense"] > 4 * peaks[path], peaks


BLOCK_MASK_PROBE = """
import resource, sys, torch
from dflash.train_kernels import AnchoredBlocks
batch, count, block, length = 2, 256, 16, 1024  # 4,096 queries over 5,120 keys
anchors = torch.sort(torch.randint(1, length, (batch, count), generator=torch.Generator().manual_seed(0)))[0]
pattern = AnchoredBlocks(anchors, length, block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pattern.flex_block_mask(count * block, length + count * block, "cpu")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_the_flex_block_mask_never_holds_the_dense_mask():
    """At batch 2, 4,096 x 5,120 the dense boolean mask is 40 MiB; building the block mask must not pass through it."""
    result = subprocess.run([sys.executable, "-c", BLOCK_MASK_PROBE], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    growth_mb = float(result.stdout.strip().splitlines()[-1])
    assert growth_mb < 20, f"peak memory grew by {growth_mb:.0f} MiB"


# ----------------------------------------- FlexAttention's tile listing, and the real compiler on the CPU

TILE = 128  # FlexAttention's tile: 128 queries x 128 keys


def needed_tiles(pattern):
    """(batch, query tiles, key tiles): where some query of the tile sees some key of the other, by the dense mask."""
    mask = pattern.dense_mask()[:, 0]  # (batch, K*B, S + K*B)
    queries, keys = mask.shape[1:]
    padded = F.pad(mask, (0, -keys % TILE, 0, -queries % TILE))  # (batch, query tiles * 128, key tiles * 128)
    tiles = padded.view(len(mask), padded.shape[1] // TILE, TILE, padded.shape[2] // TILE, TILE)
    return tiles.any(dim=4).any(dim=2)  # (batch, query tiles, key tiles)


def listed_tiles(num_blocks, indices, columns):
    """A block mask's listing, counts (batch, 1, rows) and indices (batch, 1, rows, any), as booleans
    (batch, rows, columns)."""
    counted = torch.arange(indices.shape[-1]) < num_blocks[..., None]  # (batch, 1, rows, any): the listed entries
    hits = torch.zeros(*indices.shape[:-1], columns, dtype=torch.int32)  # (batch, 1, rows, columns)
    return hits.scatter_add_(-1, indices.long(), counted.int())[:, 0] > 0  # (batch, rows, columns)


@pytest.mark.parametrize("block", range(2, 17))
def test_flex_block_mask_lists_exactly_the_tiles_the_pattern_needs(block):
    """Both listings a FlexAttention kernel reads: key tiles per query tile (forward, dq) and query tiles per key tile
    (dk, dv), each exactly the tiles where the dense mask has a visible score. Blocks that do not divide 128 straddle
    query tiles, and their keys straddle key tiles where the context is within a block of a multiple of 128: the
    contexts sweep that neighbourhood, and the blocks span 3 query tiles."""
    for context in (129, 130, 133, 200, 250, 254, 255, 256):
        pattern = anchored_pattern(context, block, -(-300 // block), seed=context)
        queries = pattern.anchors.shape[1] * block
        block_mask = pattern.flex_block_mask(queries, context + queries, "cpu")
        needed = needed_tiles(pattern)  # (batch, query tiles, key tiles)
        assert block_mask.full_kv_num_blocks is None  # every listed tile goes through mask_mod: no full tiles
        assert torch.equal(listed_tiles(block_mask.kv_num_blocks, block_mask.kv_indices, needed.shape[2]), needed)
        assert torch.equal(listed_tiles(block_mask.q_num_blocks, block_mask.q_indices, needed.shape[1]),
                           needed.transpose(1, 2))


# (context, block, anchors): blocks straddling query tiles and their keys key tiles, and a block that divides 128
COMPILED_SHAPES = [(256, 10, 30), (381, 7, 43), (130, 12, 25), (301, 16, 9)]


@pytest.mark.parametrize("context, block, count", COMPILED_SHAPES)
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)  # one kernel per shape, never a silent eager fallback
def test_flex_attention_compiled_by_inductor_equals_dense(context, block, count):
    """`attend_flex` as training runs it on a GPU, compiled by inductor, against dense masked attention.

    Uncompiled, FlexAttention runs a reference that scores every key and ignores the block mask's listing; only the
    compiled kernel skips the tiles the listing leaves out, so only it can show a tile missing. The GPU compiles
    with dynamic shapes (`compiled_flex_attention`); inductor's CPU kernel does not build so in torch 2.13, so here
    each shape is compiled as it is (static), forward only: torch 2.13 refuses FlexAttention's backward on the CPU
    (inductor's backward is a Triton kernel). The backward reads the same listings, checked exactly above.
    """
    pattern = anchored_pattern(context, block, count, seed=context)
    q, k, v = (t.detach().float() for t in random_qkv(pattern))
    out = pattern.attend_flex(q, k, v)
    torch.testing.assert_close(out, dense_attention(pattern, q, k, v), atol=1e-5, rtol=1e-5)


def test_flex_attention_has_no_backward_on_the_cpu():
    """Why the compiled test above compares values only; when a torch release adds the backward, this fails:
    then compare the gradients there too."""
    pattern = anchored_pattern(201, 10, 30, seed=0)
    q, k, v = (t.float() for t in random_qkv(pattern))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        pattern.attend_flex(q, k, v)
