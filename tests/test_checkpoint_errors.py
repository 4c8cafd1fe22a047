"""A bad checkpoint gives one clear line naming the problem, never a deep traceback."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash.errors import CheckpointError
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3

FIXTURES = Path(__file__).parent / "fixtures"


def copy_of(name, tmp_path) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    (folder / "reference.safetensors").unlink()
    return folder


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def expect_error(folder: Path, *fragments: str) -> str:
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_shard(tmp_path):
    folder = copy_of("qwen3-tiny-sharded", tmp_path)
    (folder / "model-00002-of-00003.safetensors").unlink()
    expect_error(folder, "model-00002-of-00003.safetensors", "missing")


def test_tensor_of_the_wrong_shape(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, "model.layers.1.mlp.up_proj.weight", "(3, 64)", "(160, 64)")


def test_unknown_tensor(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, "unexpected tensor", "model.layers.0.self_attn.rotary.weight")


def test_missing_tensor(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, "missing tensor", "model.norm.weight")


def test_untied_checkpoint_needs_its_lm_head(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    edit_config(folder, tie_word_embeddings=False)
    expect_error(folder, "missing tensor", "lm_head.weight")


@pytest.mark.parametrize("field, value", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("use_sliding_window", True),
    ("model_type", "llama"),
    ("layer_types", ["sliding_attention"] * 4),
    ("hidden_act", "gelu"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
])
def test_unsupported_config_field_is_named(tmp_path, field, value):
    folder = copy_of("qwen3-tiny", tmp_path)
    edit_config(folder, **{field: value})
    expect_error(folder, field)


def test_rope_theta_is_read_from_rope_parameters(tmp_path):
    """Newer transformers versions write RoPE's base inside `rope_parameters`, not as `rope_theta`."""
    folder = copy_of("qwen3-tiny", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    theta = config.pop("rope_theta")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": theta / 10}
    (folder / "config.json").write_text(json.dumps(config))
    assert Qwen3.from_pretrained(folder).config.rope_theta == theta / 10


def test_config_that_is_not_json(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    (folder / "config.json").write_text("{not json")
    expect_error(folder, "config.json", "not valid JSON")


def test_missing_folder_and_missing_weights(tmp_path):
    expect_error(tmp_path / "nowhere", "no such checkpoint folder")
    folder = copy_of("qwen3-tiny", tmp_path)
    (folder / "model.safetensors").unlink()
    expect_error(folder, "no model.safetensors")


def test_corrupt_safetensors_file(tmp_path):
    folder = copy_of("qwen3-tiny", tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    expect_error(folder, "model.safetensors", "not a readable safetensors file")


def test_pickle_files_are_never_read(tmp_path):
    """Only safetensors count: a pytorch_model.bin beside them is ignored, not unpickled."""
    folder = copy_of("qwen3-tiny", tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"boom": torch.zeros(1)}, folder / "pytorch_model.bin")
    expect_error(folder, "no model.safetensors")


# ------------------------------------------------------------------ drafter configs as newer releases write them


def drafter_copy_with(tmp_path, edit) -> Path:
    """The fixture drafter, its config.json changed by `edit(config)`."""
    folder = copy_of("dflash-tiny", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def expect_drafter_error(folder: Path, *fragments: str) -> None:
    with pytest.raises(CheckpointError) as caught:
        Drafter.from_pretrained(folder)
    assert "\n" not in str(caught.value)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_block_size_is_read_from_dflash_config_when_the_top_level_lacks_it(tmp_path):
    def move_block_size(config):
        config["dflash_config"]["block_size"] = config.pop("block_size") * 2

    assert Drafter.from_pretrained(drafter_copy_with(tmp_path, move_block_size)).config.block_size == 16


def test_two_block_sizes_that_disagree_are_refused(tmp_path):
    folder = drafter_copy_with(tmp_path, lambda config: config["dflash_config"].update(block_size=16))
    expect_drafter_error(folder, "block_size=8", "dflash_config.block_size=16", "disagree")


def test_a_drafter_without_any_block_size_is_refused(tmp_path):
    expect_drafter_error(drafter_copy_with(tmp_path, lambda config: config.pop("block_size")), "block_size is missing")


def test_sliding_window_draft_layers_are_refused_by_name(tmp_path):
    def slide_two_layers(config):
        config["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]
        config["sliding_window"] = 2048

    expect_drafter_error(drafter_copy_with(tmp_path, slide_two_layers),
                         "layer_types", "layer(s) 0, 2 are 'sliding_attention'", "only 'full_attention'")


@pytest.mark.parametrize("value", [-1, 10**12, True, 1e308])
def test_layer_types_that_is_not_a_list_is_one_line(tmp_path, value):
    """Found by tests/test_walk_options.py: TypeError ('int' object is not iterable)."""
    folder = copy_of("qwen3-tiny", tmp_path)
    edit_config(folder, layer_types=value)
    expect_error(folder, "layer_types must be a list (one kind per layer), got "
                 f"{json.dumps(value)}")


@pytest.mark.parametrize("value", [[1], {}, "8", 8.0])
def test_a_drafter_block_size_that_is_not_an_integer_is_one_line(tmp_path, value):
    """Found by tests/test_walk_options.py: TypeError (unhashable type: 'list')."""
    folder = copy_of("dflash-tiny", tmp_path)
    edit_config(folder, block_size=value)
    with pytest.raises(CheckpointError, match="block_size must be an integer of at least 2"):
        Drafter.from_pretrained(folder)
