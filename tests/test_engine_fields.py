"""benchmarks/engine_fields.py: the drafter configs we ship and export carry every field vLLM's and
SGLang's DFlash parsers read; a config with any one field removed or wrong is refused by name."""

import copy
import json
from pathlib import Path

import pytest

import train
from engine_fields import ENGINE_FIELDS, engine_field_problems
from tests.test_train import TINY, train_argv, with_steps, write_data

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = json.loads((ROOT / "weights" / "tiny-qwen3-dflash" / "config.json").read_text())
SHIPPED_TARGET = json.loads((ROOT / "weights" / "tiny-qwen3" / "config.json").read_text())

# One wrong value per row of the table, each wrong for the shipped drafter (hidden_size 128, 4
# heads, 2 layers, a target of 8 layers and 1024 tokens, block 16, layers [1, 5]).
WRONG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "llama",
    "hidden_size": 0,
    "target_hidden_size": 256,
    "num_hidden_layers": 0,
    "num_attention_heads": -4,
    "num_key_value_heads": 3,
    "head_dim": "64",
    "intermediate_size": 0,
    "hidden_act": "gelu",
    "rms_norm_eps": 0,
    "rope_theta": -1.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    "max_position_embeddings": None,
    "attention_bias": True,
    "is_neox_style": False,
    "rope_is_neox_style": False,
    "layer_types": ["full_attention", "sliding_attention"],
    "is_causal": True,
    "use_aux_hidden_state": False,
    "vocab_size": 0,
    "draft_vocab_size": 512,
    "num_target_layers": 0,
    "block_size": 1,
    "dflash_config": [],
    "dflash_config.mask_token_id": 1024,  # one past the vocabulary
    "dflash_config.target_layer_ids": [1, 8],  # the target has layers 0..7
    "eagle_aux_hidden_state_layer_ids": [1, 5],  # vLLM's ids are ours + 1: [2, 6]
    "dflash_config.block_size": 8,
    "dflash_config.causal": True,
    "dflash_config.use_swa": True,
    "dflash_config.use_aux_hidden_state": False,
    "dflash_config.attention_sink_bias": True,
    "dflash_config.mask_token": "",
    "torch_dtype": "int8",
}
NAMES = [field.name for field in ENGINE_FIELDS]
REQUIRED = {field.name for field in ENGINE_FIELDS if field.required}


def edited(config: dict, name: str, value=None, remove: bool = False) -> dict:
    """A copy of `config` with the field at the dotted path `name` set to `value`, or removed."""
    config = copy.deepcopy(config)
    *parents, key = name.split(".")
    holder = config
    for parent in parents:
        holder = holder.setdefault(parent, {})
    if remove:
        holder.pop(key, None)
    else:
        holder[key] = value
    return config


def named(problems: list[str], name: str) -> bool:
    return any(problem.startswith(f"{name}: ") for problem in problems)


def test_every_row_has_a_wrong_value_here_and_cites_where_it_is_read():
    assert sorted(WRONG) == sorted(NAMES) and len(set(NAMES)) == len(NAMES)
    for field in ENGINE_FIELDS:
        assert field.read_by and all(" " in place for place in field.read_by)  # "repo path..."
        assert field.read_by[0].split()[0] in ("vllm-project/vllm", "sgl-project/sglang",
                                               "z-lab/dflash")


def test_the_shipped_drafter_serves_as_is():
    assert engine_field_problems(SHIPPED) == []
    assert engine_field_problems(SHIPPED, SHIPPED_TARGET) == []


@pytest.mark.parametrize("name", NAMES)
def test_a_wrong_field_is_named(name):
    problems = engine_field_problems(edited(SHIPPED, name, WRONG[name]), SHIPPED_TARGET)
    assert named(problems, name), problems
    assert f"got {json.dumps(WRONG[name])}" in next(p for p in problems if named([p], name))


@pytest.mark.parametrize("name", NAMES)
def test_a_removed_field_is_named_when_the_engines_need_it(name):
    problems = engine_field_problems(edited(SHIPPED, name, remove=True), SHIPPED_TARGET)
    if name in REQUIRED:
        assert f"{name}: missing; expected " in "\n".join(problems), problems
    else:  # the engines' default is what the drafter was trained with
        assert problems == []


def test_required_fields_are_the_ones_an_engine_reads_without_a_safe_default():
    assert {"architectures", "block_size", "num_target_layers", "dflash_config.mask_token_id",
            "dflash_config.target_layer_ids", "layer_types", "head_dim", "torch_dtype"} <= REQUIRED
    assert "is_causal" not in REQUIRED and "eagle_aux_hidden_state_layer_ids" not in REQUIRED


def test_fields_that_must_match_the_target_are_compared_only_when_it_is_given():
    other_target = {**SHIPPED_TARGET, "vocab_size": 2048, "hidden_size": 256,
                    "num_hidden_layers": 4}
    problems = engine_field_problems(SHIPPED, other_target)
    for name in ("vocab_size", "hidden_size", "num_target_layers",
                 "dflash_config.target_layer_ids"):  # layer 5 of a 4-layer target
        assert named(problems, name), problems
    assert engine_field_problems(SHIPPED) == []


def test_rope_theta_may_sit_in_rope_parameters_and_vllm_aux_ids_may_agree():
    moved = edited(edited(SHIPPED, "rope_theta", remove=True), "rope_parameters",
                   {"rope_type": "default", "rope_theta": 1000000.0})
    assert engine_field_problems(moved) == []
    assert engine_field_problems(edited(SHIPPED, "eagle_aux_hidden_state_layer_ids", [2, 6])) == []


def test_a_drafter_exported_by_train_py_serves_as_is(tmp_path):
    data = tmp_path / "data.jsonl"
    write_data(data)
    target = json.loads((TINY / "config.json").read_text())
    assert train.main(with_steps(train_argv(data, tmp_path / "f32"), 2)) == 0
    exported = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert engine_field_problems(exported, target) == []
    argv = with_steps(train_argv(data, tmp_path / "bf16", "--save-dtype", "bfloat16"), 2)
    assert train.main(argv) == 0
    exported = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert exported["torch_dtype"] == "bfloat16" and engine_field_problems(exported, target) == []
