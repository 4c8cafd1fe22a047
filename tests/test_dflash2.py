"""DFlash2 (dflash/dflash2.py) against the authors' reference run on the tiny fixtures.

Tolerance: float32 on both sides, the reference's numbers differ from ours by at most about
5e-6 (the sum order of the convolution and of attention); every comparison allows 1e-5.
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import make_data
import train
from dflash.checkpoint import CheckpointError
from dflash.dflash2 import (CandidateSelector, DFlash2Config, DFlash2Drafter,
                            GroupedDynamicCausalConv, grouped_dynamic_convolve, load_drafter,
                            over_the_vocabulary, selector_loss)
from dflash.drafter import Drafter
from dflash.qwen3 import KVCache, Qwen3
from dflash.sampling import tempered_softmax, verdicts
from dflash.train_kernels import AnchoredBlocks
from generate import generate_autoregressive, generate_dflash
from tests.test_line_width import wide_lines

FIXTURES = Path(__file__).parent / "fixtures"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny", FIXTURES / "dflash2-tiny"
REFERENCE = FIXTURES / "dflash2-reference"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def pair():
    target = Qwen3.from_pretrained(TARGET)
    return target, load_drafter(DRAFTER, target), load_file(REFERENCE / "reference.safetensors")


def draft_hidden(drafter, target, ref, cache=None):
    """The drafter's output on the reference's inputs (positions 0..11 context, 12..19 block)."""
    block = drafter.embed_block(target, ref["block_ids"])
    return drafter(ref["features"], block, torch.arange(12), torch.arange(12, 20), cache=cache)


# ------------------------------------------------------------------------- the released layout


def test_the_released_config_builds_the_released_tensors():
    raw = json.loads((REFERENCE / "released-config.json").read_text())
    config = DFlash2Config.from_dict(raw)
    assert (config.conv_kernel_size, config.conv_group_size) == (2, 16)
    assert (config.selector_rank, config.selector_top_k, config.block_size) == (256, 16, 16)
    assert config.final_logit_softcapping == 20.0
    assert config.output_multiplier == 0.19611613513818404
    assert (config.sliding_window, config.is_causal) == (2048, False)
    assert config.target_layer_ids == [1, 13, 25, 37, 49] and config.mask_token_id == 201818
    with torch.device("meta"):
        model = DFlash2Drafter(config)
    ours = {name: list(p.shape) for name, p in model.named_parameters()}
    assert ours == json.loads((REFERENCE / "released-tensor-shapes.json").read_text())


def test_a_dflash_checkpoint_still_loads_as_dflash(pair):
    target, drafter, _ = pair
    assert type(load_drafter(FIXTURES / "dflash-tiny")) is Drafter
    assert type(drafter) is DFlash2Drafter


def test_save_is_byte_for_byte_the_released_layout(pair, tmp_path):
    """Loaded in float32 and saved in bfloat16, the tiny checkpoint (written by hand in the
    released names) comes back byte for byte: names, shapes, dtypes, values."""
    _, drafter, _ = pair
    drafter.save_pretrained(tmp_path, dtype=torch.bfloat16)
    saved = (tmp_path / "model.safetensors").read_bytes()
    assert saved == (DRAFTER / "model.safetensors").read_bytes()
    reloaded = json.loads((tmp_path / "config.json").read_text())
    assert DFlash2Config.from_dict(reloaded) == drafter.config


def refused(raw: dict) -> str:
    with pytest.raises(CheckpointError) as caught:
        DFlash2Config.from_dict(raw, "config.json")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("config.json: ")
    return message


def tiny_config() -> dict:
    return json.loads((DRAFTER / "config.json").read_text())


@pytest.mark.parametrize("edit, fragment", [
    (lambda c: c["dflash_config"].update(tree_width=4), "dflash_config.tree_width is not"),
    (lambda c: c["dflash_config"].pop("selector_rank"), "selector_rank is missing"),
    (lambda c: c["dflash_config"].update(conv_group_size=24), "does not divide hidden_size=64"),
    (lambda c: c["dflash_config"].update(selector_top_k=513), "more than vocab_size=512"),
    (lambda c: c["dflash_config"].update(conv_kernel_size=0), "conv_kernel_size must be"),
    (lambda c: c["dflash_config"].update(final_logit_softcapping=-1), "softcapping must be"),
    (lambda c: c["dflash_config"].update(output_multiplier="1"), "output_multiplier must be"),
    (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "mixes full"),
    (lambda c: c.update(layer_types=["chunked_attention"] * 2), "layer_types must list"),
    (lambda c: c.update(layer_types=["sliding_attention"]), "1 entries for num_hidden_layers"),
    (lambda c: c.update(sliding_window=None), "sliding_window must be a positive integer"),
    (lambda c: c.update(is_causal="yes"), "is_causal must be true, false or null"),
    (lambda c: c.update(architectures=["DFlashDraftModel"]), "architectures must be"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn"}), "rope_parameters="),
])
def test_fields_it_cannot_honour_are_refused_in_one_line(edit, fragment):
    raw = tiny_config()
    edit(raw)
    assert fragment in refused(raw)


@pytest.mark.parametrize("field, value", [("output_multiplier", 0.5),
                                          ("final_logit_softcapping", 30.0),
                                          ("input_embedding_scale", 2.0)])
def test_a_dflash_checkpoint_that_scales_its_head_is_refused(tmp_path, field, value):
    """The reference honours these for DFlash drafters too; the DFlash drafter does not."""
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((FIXTURES / "dflash-tiny" / name).read_bytes())
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["dflash_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=f"{field}={value} is not supported for a DFlash"):
        load_drafter(tmp_path)
    raw["dflash_config"][field] = None if field == "final_logit_softcapping" else 1.0
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert type(load_drafter(tmp_path)) is Drafter  # the values that change nothing


def test_a_refused_checkpoint_folder_says_so_on_load(tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((DRAFTER / name).read_bytes())
    raw = tiny_config()
    raw["dflash_config"]["selector_top_k"] = 1000
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="selector_top_k=1000 is more than vocab_size"):
        load_drafter(tmp_path)


# ------------------------------------------------------------------- equal to the reference


@torch.no_grad()
def test_hidden_states_and_logits_equal_the_reference(pair):
    target, drafter, ref = pair
    _, features = target(ref["context_ids"], capture_layers=drafter.config.target_layer_ids)
    assert (features - ref["features"]).abs().max() <= TOLERANCE
    block = drafter.embed_block(target, ref["block_ids"])
    assert (block - ref["block_embeddings"]).abs().max() <= TOLERANCE
    hidden = draft_hidden(drafter, target, ref)
    assert (hidden - ref["draft_hidden"]).abs().max() <= TOLERANCE
    logits = drafter.logits(hidden[:, 1:], target)
    assert (logits - ref["draft_logits"]).abs().max() <= TOLERANCE
    assert logits.abs().max() < drafter.config.final_logit_softcapping  # the cap at work


@torch.no_grad()
def test_batched_positions_and_a_cache_give_the_reference_too(pair):
    """Training's (batch, n) positions, and the context fed in two steps through a cache, as
    the speculative loop does: the same hidden states, the window counted in positions."""
    target, drafter, ref = pair
    block = drafter.embed_block(target, ref["block_ids"])
    positions = ref["position_ids"]  # (2, 20)
    hidden = drafter(ref["features"], block, positions[:, :12], positions[:, 12:])
    assert (hidden - ref["draft_hidden"]).abs().max() <= TOLERANCE
    cache = KVCache.for_layers(drafter.config.layers, drafter.fc.weight, 64, batch=2)
    drafter(ref["features"][:, :6], block, torch.arange(6), torch.arange(6, 14), cache=cache)
    cache.commit(6)  # the first 6 context positions kept, the block forgotten
    hidden = drafter(ref["features"][:, 6:], block, torch.arange(6, 12), torch.arange(12, 20),
                     cache=cache)
    assert (hidden - ref["draft_hidden"]).abs().max() <= TOLERANCE
    cache.read_limit = 64  # all 64 slots, as a fixed-shape pass reads; the mask hides the unwritten
    hidden = drafter(ref["features"][:, 6:], block, torch.arange(6, 12), torch.arange(12, 20),
                     cache=cache)
    assert (hidden - ref["draft_hidden"]).abs().max() <= TOLERANCE


@torch.no_grad()
def test_the_sliding_window_is_what_makes_it_equal(pair):
    """Without its window the drafter is far from the reference: the window above was tested."""
    target, drafter, ref = pair
    config = drafter.config
    drafter.config = replace(config, sliding_window=None)
    try:
        hidden = draft_hidden(drafter, target, ref)
    finally:
        drafter.config = config
    assert (hidden - ref["draft_hidden"]).abs().max() > 100 * TOLERANCE


def test_a_mask_of_its_own_is_refused_where_it_would_ignore_the_window(pair):
    target, drafter, ref = pair
    block = drafter.embed_block(target, ref["block_ids"])
    with pytest.raises(ValueError, match="builds its own attention mask"):
        drafter(ref["features"], block, torch.arange(12), torch.arange(12, 20),
                attend=lambda q, k, v: q)


def by_token(candidates: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Values (..., k) reordered by their candidates' token ids: the reference's top-k is
    unsorted, ours likeliest first."""
    return values.gather(-1, candidates.argsort(dim=-1))


@torch.no_grad()
def test_greedy_drafts_equal_the_reference(pair):
    target, drafter, ref = pair
    hidden = ref["draft_hidden"][:, 1:]  # the slots after the anchor, as the reference's loop
    tokens, candidates, probs = drafter.propose(hidden, ref["block_ids"][:, 0], target, 0.0)
    assert probs is None and torch.equal(tokens, ref["greedy_tokens"])
    assert not torch.equal(tokens, drafter.logits(hidden, target).argmax(-1))  # the walk mattered
    assert torch.equal(candidates.sort(-1).values, ref["greedy_candidates"].sort(-1).values)
    selector, previous = drafter.candidate_selector, ref["block_ids"][:, 0]
    unary, _ = selector.candidates(drafter.logits(hidden, target))
    projected = selector.hidden_projection(hidden)
    for slot in range(hidden.shape[1]):
        scores = selector.scores(projected[:, slot], unary[:, slot], candidates[:, slot],
                                 previous)
        theirs = by_token(ref["greedy_candidates"][:, slot], ref["greedy_scores"][:, slot])
        assert (by_token(candidates[:, slot], scores) - theirs).abs().max() <= TOLERANCE
        previous = tokens[:, slot]


@torch.no_grad()
def test_sampled_walk_draws_from_the_reference_probabilities(pair):
    """Given the tokens the reference drew, each slot's distribution over its candidates is the
    reference's; the draws themselves differ (another generator, another candidate order)."""
    target, drafter, ref = pair
    hidden, temperature = ref["draft_hidden"][:, 1:], ref["temperature"].item()
    selector, previous = drafter.candidate_selector, ref["block_ids"][:, 0]
    unary, candidates = selector.candidates(drafter.logits(hidden, target))
    projected = selector.hidden_projection(hidden)
    for slot in range(hidden.shape[1]):
        scores = selector.scores(projected[:, slot], unary[:, slot], candidates[:, slot],
                                 previous)
        ours = by_token(candidates[:, slot], tempered_softmax(scores, temperature).float())
        theirs = by_token(ref["sampled_candidates"][:, slot], ref["sampled_probs"][:, slot])
        assert (ours - theirs).abs().max() <= TOLERANCE
        previous = ref["sampled_tokens"][:, slot]
    generator = torch.Generator().manual_seed(0)
    tokens, candidates, probs = drafter.propose(hidden, ref["block_ids"][:, 0], target,
                                                temperature, generator)
    assert (tokens[..., None] == candidates).any(-1).all()  # every draw is a candidate
    assert torch.allclose(probs.sum(-1), torch.ones(2, 7, dtype=probs.dtype))


def test_candidate_probabilities_over_the_vocabulary_judge_as_the_reference():
    """The reference's `_rejection_sample` with `draft_indices` reads q(d) as the sum of the
    probabilities of the candidates equal to d and subtracts q from p by scatter_add; spread
    over the vocabulary, q gives the same numbers, which `verdicts` then judges."""
    generator = torch.Generator().manual_seed(9)
    target_probs = torch.softmax(torch.randn(4, 50, generator=generator), -1).double()
    candidates = torch.stack([torch.randperm(50, generator=generator)[:6] for _ in range(3)])
    probs = torch.softmax(torch.randn(3, 6, generator=generator), -1).double()
    drafts = candidates[:, 0]
    full = over_the_vocabulary(candidates, probs, 50)  # (3, 50)
    theirs_q = (probs * (candidates == drafts[:, None])).sum(-1)
    assert torch.equal(full.gather(-1, drafts[:, None])[:, 0], theirs_q)
    for slot in range(3):
        theirs = target_probs[slot].clone().scatter_add_(0, candidates[slot], -probs[slot])
        assert torch.allclose((target_probs[slot] - full[slot]).clamp(min=0),
                              theirs.clamp(min=0), atol=1e-15)
    tokens = verdicts(target_probs, torch.cat([drafts, drafts[:1]]), full, generator)
    assert tokens.shape == (4,)


# --------------------------------------------------------------- the parts, against slow ones


def slow_greedy_walk(selector, hidden, logits, anchors):
    """The selector's greedy walk written out with loops, one number at a time."""
    k, paths = selector.top_k, []
    for row in range(hidden.shape[0]):
        previous, path = anchors[row].item(), []
        for slot in range(hidden.shape[1]):
            projected = selector.hidden_projection.weight @ hidden[row, slot]  # (rank,)
            best, best_score = None, -float("inf")
            for token in logits[row, slot].topk(k).indices.tolist():
                pair = sum(selector.predecessor_codebook[previous, r].item() * projected[r].item()
                           * selector.successor_codebook[token, r].item()
                           for r in range(len(projected)))
                score = logits[row, slot, token].item() + pair
                if score > best_score:
                    best, best_score = token, score
            path.append(best)
            previous = best
        paths.append(path)
    return torch.tensor(paths)


@torch.no_grad()
def test_the_greedy_walk_equals_a_slow_obvious_one(pair):
    _, drafter, _ = pair
    selector = drafter.candidate_selector
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, 64, generator=generator)
    logits = 3 * torch.randn(3, 5, 512, generator=generator)
    anchors = torch.randint(0, 512, (3,), generator=generator)
    tokens, _, _ = selector.select(hidden, logits, anchors, 0.0)
    assert torch.equal(tokens, slow_greedy_walk(selector, hidden, logits, anchors))


def test_the_convolution_is_the_formula():
    """out[t] = sum_o (base[o] + dynamic[t, o, group]) * x[t - o], zeros before the block."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 8, generator=generator)
    dynamic = torch.randn(2, 6, 3, 2, generator=generator)  # 3 taps, 2 groups of 4 channels
    base = torch.randn(3, 8, generator=generator)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(6):
            for o in range(min(3, t + 1)):
                for c in range(8):
                    weight = base[o, c] + dynamic[b, t, o, c // 4]
                    expected[b, t, c] += weight * x[b, t - o, c]
    actual = grouped_dynamic_convolve(x, dynamic, base, group_size=4)
    assert torch.allclose(actual, expected, atol=1e-6)


@torch.no_grad()
@pytest.mark.parametrize("slot", [0, 3, 5])
def test_the_convolution_is_causal(slot):
    """A change at slot j changes nothing before j, in `prepare` and in `finish`, and does
    change slot j."""
    torch.manual_seed(11)
    conv = GroupedDynamicCausalConv(hidden_size=16, kernel_size=2, group_size=4)
    torch.nn.init.normal_(conv.base_kernel)
    x = torch.randn(1, 6, 16)
    changed = x.clone()
    changed[:, slot] += 1.0
    (before, kernel), (before_changed, kernel_changed) = conv.prepare(x), conv.prepare(changed)
    after, after_changed = conv.finish(x, kernel), conv.finish(changed, kernel_changed)
    for ours, theirs in ((before, before_changed), (after, after_changed)):
        assert torch.equal(ours[:, :slot], theirs[:, :slot])
        assert not torch.allclose(ours[:, slot], theirs[:, slot])


def test_lines_fit_in_100_columns():
    root = Path(__file__).resolve().parents[1]
    assert wide_lines(root / "dflash" / "dflash2.py") == []
    assert wide_lines(root / "tests" / "test_dflash2.py") == []
    for name in ("train.py", "dflash/train_config.py"):
        assert wide_lines(root / name) == []


# ------------------------------------------------------------------------------- training


def training_drafter(block_size: int = 4) -> DFlash2Drafter:
    """A new DFlash2 drafter for the tiny target, as `train.py --arch dflash2` starts one, its
    convolutions then made non-trivial so that a leak between blocks would show."""
    target = Qwen3.from_pretrained(TARGET)
    cfg = train.TrainConfig(arch="dflash2", drafter_layers=1, block_size=block_size)
    config = train.build_drafter_config(cfg, target.config, None)
    drafter = train.init_drafter(DFlash2Drafter(config), 0).start_training()
    with torch.no_grad():
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                torch.nn.init.normal_(conv.base_kernel, std=0.5)
                torch.nn.init.normal_(conv.kernel_projection.weight, std=0.1)
    return drafter.eval()


@torch.no_grad()
def test_a_new_drafter_starts_with_identity_convolutions():
    conv = GroupedDynamicCausalConv(hidden_size=16, kernel_size=2, group_size=4)
    conv.start_as_identity()
    x = torch.randn(2, 5, 16)
    before, kernel = conv.prepare(x)
    assert torch.equal(before, x) and torch.equal(conv.finish(x, kernel), x)


@torch.no_grad()
def test_training_forward_matches_the_inference_draft_block_by_block():
    """Blocks side by side in one forward (training's) each compute what the loop's cached draft
    computes: the convolution's taps stop at each block's start, the masks are training's."""
    torch.manual_seed(1)
    drafter = training_drafter(block_size=4)
    width = len(drafter.config.target_layer_ids) * 64
    features, embeddings = torch.randn(1, 12, width), torch.randn(1, 8, 64)
    anchors = torch.tensor([[5, 9]])  # blocks at 5..8 and 9..12: adjacent, so a leak would show
    pattern = AnchoredBlocks(anchors, features.shape[1], 4, blocks_per_chunk=1)
    together = drafter(features, embeddings, torch.arange(12), train.block_positions(anchors, 4),
                       attend=pattern.attend, block_size=4)
    for j, a in enumerate(anchors[0].tolist()):
        cache = KVCache.for_layers(drafter.config.layers, drafter.fc.weight, 16)
        alone = drafter(features[:, :a], embeddings[:, 4 * j:4 * j + 4], torch.arange(a),
                        torch.arange(a, a + 4), cache=cache)
        torch.testing.assert_close(together[:, 4 * j:4 * j + 4], alone, atol=1e-5, rtol=1e-5)
    leaky = drafter(features, embeddings, torch.arange(12), train.block_positions(anchors, 4),
                    attend=pattern.attend)  # without block_size the taps cross into block 1
    assert not torch.allclose(leaky[:, 4], together[:, 4], atol=1e-3)


def test_the_selector_loss_adds_a_missing_true_token_and_counts_only_real_hits():
    selector = CandidateSelector(vocab_size=10, hidden_size=4, rank=3, top_k=3)
    torch.nn.init.normal_(selector.predecessor_codebook)
    torch.nn.init.normal_(selector.successor_codebook)
    logits = torch.tensor([[5.0, 4, 3, 2, 1, 0, 0, 0, 0, 0]] * 2, requires_grad=True)
    hidden = torch.zeros(2, 4)  # no pair term: the scores are the logits
    labels, predecessors = torch.tensor([0, 4]), torch.tensor([1, 2])
    loss, hits = selector_loss(selector, hidden, logits, predecessors, labels)
    assert hits.tolist() == [True, False]  # token 4 is not among the top 3: never drafted
    # Row 1's loss is over [5, 4, logit of 4 = 1], the true token last.
    expected = -torch.log_softmax(torch.tensor([5.0, 4.0, 1.0]), 0)[2]
    assert torch.allclose(loss[1], expected)
    hidden = torch.randn(2, 4, requires_grad=True)
    loss, _ = selector_loss(selector, hidden, logits, predecessors, labels)
    loss.sum().backward()
    assert selector.successor_codebook.grad[4].abs().sum() > 0  # the injected token learns
    assert selector.predecessor_codebook.grad[2].abs().sum() > 0
    assert hidden.grad.abs().sum() > 0 and logits.grad.abs().sum() > 0


def test_train_py_trains_a_dflash2_drafter_that_the_loop_serves(tmp_path):
    """A few steps of `train.py --arch dflash2` on the tiny target's own answers: the loss is
    finite, the saved folder is the released DFlash2 layout, and greedy decoding with it is
    the plain loop's."""
    prompts = tmp_path / "prompts.jsonl"
    generator = torch.Generator().manual_seed(0)
    prompts.write_text("".join(json.dumps({"prompt_ids": torch.randint(
        0, 500, (6,), generator=generator).tolist()}) + "\n" for _ in range(8)))
    assert make_data.main(["--target", str(TARGET), "--prompts", str(prompts), "--out",
                           str(tmp_path / "data.jsonl"), "--max-new-tokens", "16",
                           "--device", "cpu"]) == 0
    out = tmp_path / "run"
    assert train.main(["--target", str(TARGET), "--data", str(tmp_path / "data.jsonl"), "--out",
                       str(out), "--arch", "dflash2", "--drafter-layers", "1", "--block-size",
                       "4", "--num-anchors", "4", "--batch-size", "4", "--steps", "3",
                       "--log-every", "1", "--loss-chunk-size", "5", "--device", "cpu"]) == 0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 3 and all(math.isfinite(line["loss"]) for line in log)
    target = Qwen3.from_pretrained(TARGET)
    drafter = load_drafter(out, target)
    assert type(drafter) is DFlash2Drafter
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    prompt = [115, 392, 221, 286, 283]
    assert (generate_dflash(target, drafter, prompt, 12).new_ids
            == generate_autoregressive(target, prompt, 12).new_ids)


def test_dflash2_training_refuses_what_it_does_not_do(capsys, tmp_path):
    for extra, fragment in ((["--distill-weight", "0.5"], "--distill-weight is not supported"),
                            (["--eval-prompts", "x.jsonl"], "--eval-prompts is not supported")):
        code = train.main(["--target", str(TARGET), "--data", str(tmp_path / "none.jsonl"),
                           "--out", str(tmp_path / "run"), "--arch", "dflash2", *extra])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and fragment in err, err
        assert not (tmp_path / "run").exists()


def test_the_selector_loss_trains_the_selector_only():
    """The backbone's gradient is the head's loss alone, whatever --selector-weight; the
    selector's comes from its own loss."""
    target = train.freeze(Qwen3.from_pretrained(TARGET))
    drafter = training_drafter(block_size=4).train()
    config = drafter.config
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(0))
    batch = train.MicroBatch(ids, torch.tensor([[0] * 6 + [1] * 10]), torch.tensor([[6, 10]]),
                             torch.tensor([[True, True]]))
    features = train.target_features(target, ids, config)
    grads = []
    for weight in (0.0, 1.0):
        drafter.zero_grad()
        loss, correct, counted = train.drafter_loss(
            target, drafter, features, batch, config=config, weights=train.slot_weights(4, 2.0),
            selector_weight=weight, loss_chunk_size=4)
        loss.backward()
        grads.append({name: p.grad.clone() for name, p in drafter.named_parameters()
                      if p.grad is not None})
    assert counted.tolist() == [0, 2, 2, 2] and correct.shape == (4,)
    for name, grad in grads[0].items():
        if name.startswith("candidate_selector."):  # learns from its own loss only
            assert not grad.any() and grads[1][name].any(), name
        else:
            torch.testing.assert_close(grads[1][name], grad)
