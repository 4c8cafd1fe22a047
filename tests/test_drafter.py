"""The DFlash drafter against the authors' code's outputs on the dflash-tiny checkpoint."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from dflash.drafter import Drafter, default_target_layer_ids
from dflash.errors import CheckpointError
from dflash.qwen3 import KVCache, Qwen3
from tests.reference import as_the_reference_was_made

FIXTURES = Path(__file__).parent / "fixtures"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny"


@pytest.fixture(scope="module")
def pair():
    target = as_the_reference_was_made(Qwen3.from_pretrained(TARGET))
    drafter = as_the_reference_was_made(Drafter.from_pretrained(DRAFTER, target=target))
    return target, drafter, load_file(DRAFTER / "reference.safetensors")


def split_positions(ref):
    positions = ref["position_ids"][0]  # (context + block,)
    context = ref["context_ids"].shape[1]
    return positions[:context], positions[context:]


@torch.no_grad()
def test_context_features_match(pair):
    target, drafter, ref = pair
    _, features = target(ref["context_ids"], capture_layers=drafter.config.target_layer_ids)
    assert features.shape == ref["context_features"].shape
    assert (features - ref["context_features"]).abs().max() <= 1e-4


@torch.no_grad()
def test_draft_hidden_and_logits_match(pair):
    target, drafter, ref = pair
    context_positions, block_positions = split_positions(ref)
    hidden = drafter(ref["context_features"], target.embed_tokens(ref["block_ids"]),
                     context_positions, block_positions)
    assert (hidden - ref["draft_hidden"]).abs().max() <= 1e-4
    assert (target.logits(hidden) - ref["draft_logits"]).abs().max() <= 1e-4


@torch.no_grad()
def test_cached_context_gives_the_same_draft(pair):
    """Context fed in two steps through the drafter's cache == all of it at once."""
    target, drafter, ref = pair
    context_positions, block_positions = split_positions(ref)
    features, block = ref["context_features"], target.embed_tokens(ref["block_ids"])
    cache = KVCache.for_layers(drafter.config.layers, drafter.fc.weight, 64)
    first_block = block_positions - block_positions[0] + 6  # right after the first 6 context positions
    drafter(features[:, :6], block, context_positions[:6], first_block, cache=cache)
    cache.commit(6)  # keep the context; the block's slots were scratch
    hidden = drafter(features[:, 6:], block, context_positions[6:], block_positions, cache=cache)
    assert (hidden - ref["draft_hidden"]).abs().max() <= 1e-4


@torch.no_grad()
def test_block_is_bidirectional_and_sees_the_context(pair):
    target, drafter, ref = pair
    context_positions, block_positions = split_positions(ref)
    block = target.embed_tokens(ref["block_ids"])
    base = drafter(ref["context_features"], block, context_positions, block_positions)
    changed_last = block.clone()
    changed_last[:, -1] += 1.0
    assert not torch.allclose(drafter(ref["context_features"], changed_last, context_positions, block_positions)[:, 0],
                              base[:, 0])  # slot 0 looks ahead: no causal mask
    other_context = ref["context_features"].clone()
    other_context[:, 0] += 1.0
    assert not torch.allclose(drafter(other_context, block, context_positions, block_positions), base)


def test_save_reload_is_bit_identical_with_the_released_layout(pair, tmp_path):
    target, drafter, _ = pair
    drafter.save_pretrained(tmp_path, dtype=torch.bfloat16)
    again = Drafter.from_pretrained(tmp_path, target=target)
    for (name, ours), (_, theirs) in zip(drafter.named_parameters(), again.named_parameters()):
        assert torch.equal(ours, theirs), name
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved, \
            safe_open(str(DRAFTER / "model.safetensors"), "pt") as released:
        assert sorted(saved.keys()) == sorted(released.keys())
        for name in released.keys():
            assert torch.equal(saved.get_tensor(name), released.get_tensor(name)), name
    config = json.loads((tmp_path / "config.json").read_text())
    released_config = json.loads((DRAFTER / "config.json").read_text())
    for key in ("block_size", "num_target_layers", "dflash_config", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "rms_norm_eps", "rope_theta", "vocab_size", "architectures", "model_type"):
        assert config[key] == released_config[key], key
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                 "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                 "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
                 "mlp.up_proj.weight", "mlp.down_proj.weight"]
    names |= {f"layers.{i}.{n}" for i in range(3) for n in per_layer}
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        assert set(saved.keys()) == names


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(28, 3) == [1, 13, 25]


def test_missing_target_layer_ids_use_the_default(tmp_path):
    folder = drafter_copy(tmp_path, lambda c: c["dflash_config"].pop("target_layer_ids"))
    assert Drafter.from_pretrained(folder).config.target_layer_ids == default_target_layer_ids(6, 3)


def drafter_copy(tmp_path, edit) -> Path:
    folder = tmp_path / "drafter"
    shutil.copytree(DRAFTER, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("edit, fragments", [
    (lambda c: c.update(num_target_layers=8), ["num_target_layers=8", "num_hidden_layers=6"]),
    (lambda c: c.update(vocab_size=700), ["vocab_size=700", "vocab_size=600"]),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 2, 6]), ["target_layer_ids", "6"]),
    (lambda c: c["dflash_config"].update(mask_token_id=600), ["mask_token_id=600", "vocab_size=600"]),
    (lambda c: c["dflash_config"].pop("mask_token_id"), ["mask_token_id"]),
    (lambda c: c.pop("block_size"), ["block_size"]),
])
def test_a_drafter_that_does_not_fit_is_refused(pair, tmp_path, edit, fragments):
    target, _, _ = pair
    folder = drafter_copy(tmp_path, edit)
    with pytest.raises(CheckpointError) as caught:
        Drafter.from_pretrained(folder, target=target)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_hidden_size_mismatch_names_both_values(pair):
    _, _, _ = pair
    other_target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    with pytest.raises(CheckpointError, match=r"hidden_size=96 .* hidden_size=64"):
        Drafter.from_pretrained(DRAFTER, target=other_target)
