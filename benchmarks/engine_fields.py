"""What vLLM's and SGLang's DFlash drafter parsers read from a drafter's `config.json`, and a
check that an exported config gives each of them what it expects.

A drafter that loads here can still be served wrong. An engine reads its own fields and falls
back to its own default when one is missing, without a word: SGLang takes a missing block_size
for 16, vLLM builds the block's attention causally when a config says `is_causal`, and reads
`eagle_aux_hidden_state_layer_ids` before `dflash_config.target_layer_ids`. Each row of
`ENGINE_FIELDS` is one field: who reads it, where (repository, file and function, as read in
their code), and what it must be for a drafter trained here. `engine_field_problems` names every
row a config breaks; given the target's config too, it also compares what must agree with it.

The engines' code was read in a public index of GitHub sources (vllm-project/vllm,
sgl-project/sglang, and z-lab/dflash, the authors' reference); the rows cite only what was read
there. Two citations come from copies other than the newest: vLLM's registry entry for
"DFlashDraftModel" was read in a copy of registry.py (the stored upstream one predates DFlash),
and its dtype rule in an older vllm/config.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from dflash.checkpoint import is_integer, is_number

ABSENT = object()  # a field the config does not have (None is JSON's null, a value)

# Where each engine reads its fields; a row cites these, plus the function.
VLLM_MODEL = "vllm-project/vllm vllm/model_executor/models/qwen3_dflash.py"
VLLM_AUX = ("vllm-project/vllm vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py: "
            "get_eagle3_aux_layers_from_config")
VLLM_MASK = ("vllm-project/vllm vllm/v1/spec_decode/llm_base_proposer.py: "
             "_init_parallel_drafting_params")
VLLM_REGISTRY = ("vllm-project/vllm vllm/model_executor/models/registry.py: "
                 "_SPECULATIVE_DECODING_MODELS")
VLLM_DTYPE = "vllm-project/vllm vllm/config.py: _find_dtype (an older vLLM, as read)"
SGLANG_MODEL = "sgl-project/sglang python/sglang/srt/models/dflash.py"
SGLANG_PARSE = ("sgl-project/sglang python/sglang/srt/speculative/dflash_utils.py: "
                "parse_dflash_draft_config")
AUTHORS = "z-lab/dflash dflash/model.py: DFlashDraftModel.__init__"

Rule = Callable[[Any, dict, "dict | None"], bool]  # (value or ABSENT, drafter config, target's)


@dataclass(frozen=True)
class EngineField:
    """One `config.json` field an engine reads: a dotted path (`dflash_config.mask_token_id`),
    the places that read it, what it must be, and the test of that (given the whole config and,
    when known, the target's); `required`: a config without it fails."""

    name: str
    read_by: tuple[str, ...]
    expect: str
    rule: Rule
    required: bool = True


def value_at(config: dict, name: str):
    """The value at a dotted path of a config, or ABSENT."""
    value = config
    for key in name.split("."):
        if not isinstance(value, dict) or key not in value:
            return ABSENT
        value = value[key]
    return value


def positive_int(value) -> bool:
    return is_integer(value) and value > 0


def absent_or(wanted) -> Rule:
    """A field an engine defaults to `wanted` when absent: absent, or exactly `wanted`."""
    return lambda value, config, target: value is ABSENT or value == wanted


def same_as_target(name: str, rule: Callable[[Any], bool]) -> Rule:
    """`rule`, and, when the target's config is known, the target's own value of `name`."""
    return lambda value, config, target: rule(value) and (
        target is None or value == target.get(name, value))


def rope_theta(config: dict):
    """RoPE's base: at the top level, or where newer transformers versions write it."""
    found = config.get("rope_theta", ABSENT)
    parameters = config.get("rope_parameters")
    if found is ABSENT and isinstance(parameters, dict):
        found = parameters.get("rope_theta", ABSENT)
    return found


def valid_layer_ids(ids, config: dict, target: dict | None) -> bool:
    """A non-empty list of target layers, each below the target's depth (the config's own
    num_target_layers, and the target's num_hidden_layers when known)."""
    depths = [config.get("num_target_layers")]
    if target:
        depths.append(target.get("num_hidden_layers"))
    depth = min((d for d in depths if positive_int(d)), default=None)
    return (isinstance(ids, list) and bool(ids) and all(is_integer(i) for i in ids)
            and depth is not None and all(0 <= i < depth for i in ids))


def valid_mask_token(token, config: dict, target: dict | None) -> bool:
    """An embedding row the target has: 0 <= id < vocab_size (JSON's true is not an id)."""
    vocab = (target or config).get("vocab_size")
    return is_integer(token) and positive_int(vocab) and 0 <= token < vocab


def full_attention_per_layer(kinds, config: dict, target: dict | None) -> bool:
    return (isinstance(kinds, list) and len(kinds) == config.get("num_hidden_layers")
            and all(kind == "full_attention" for kind in kinds))


ENGINE_FIELDS = (
    EngineField(
        "architectures", (VLLM_REGISTRY, f"{SGLANG_MODEL}: EntryClass", AUTHORS),
        'a list naming "DFlashDraftModel" (vLLM maps it to DFlashQwen3ForCausalLM, SGLang\'s '
        "DFlash model class has that name)",
        lambda value, config, target: isinstance(value, list) and "DFlashDraftModel" in value),
    EngineField(
        "model_type", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer", f"{AUTHORS} (config_class)"),
        '"qwen3": both are written against transformers\' Qwen3Config, the class model_type '
        "picks",
        lambda value, config, target: value == "qwen3"),
    EngineField(
        "hidden_size", (f"{VLLM_MODEL}: DFlashQwen3Model", f"{SGLANG_MODEL}: DFlashDraftModel",
                        AUTHORS),
        "a positive integer, the target's (SGLang's fc takes features * hidden_size inputs)",
        same_as_target("hidden_size", positive_int)),
    EngineField(
        "target_hidden_size", (f"{VLLM_MODEL}: _get_dflash_fc_input_size",),
        "absent, or hidden_size (vLLM sizes fc by it when present)",
        lambda value, config, target: value is ABSENT or value == config.get("hidden_size"),
        required=False),
    EngineField(
        "num_hidden_layers", (f"{VLLM_MODEL}: DFlashQwen3Model", SGLANG_PARSE, AUTHORS),
        "a positive integer: the drafter's own depth",
        lambda value, config, target: positive_int(value)),
    EngineField(
        "num_attention_heads", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                                f"{SGLANG_MODEL}: DFlashAttention"),
        "a positive integer",
        lambda value, config, target: positive_int(value)),
    EngineField(
        "num_key_value_heads", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                                f"{SGLANG_MODEL}: DFlashAttention"),
        "a positive integer dividing num_attention_heads",
        lambda value, config, target: positive_int(value) and positive_int(
            config.get("num_attention_heads")) and config["num_attention_heads"] % value == 0),
    EngineField(
        "head_dim", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer", f"{SGLANG_MODEL}: DFlashAttention"),
        "a positive integer, written out: both fall back to hidden_size // num_attention_heads, "
        "which is not Qwen3's head_dim at every width",
        lambda value, config, target: positive_int(value)),
    EngineField(
        "intermediate_size", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                              f"{SGLANG_MODEL}: DFlashMLP"),
        "a positive integer (SGLang refuses 0 or less)",
        lambda value, config, target: positive_int(value)),
    EngineField(
        "hidden_act", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer", f"{SGLANG_MODEL}: DFlashMLP"),
        'absent or "silu" (SGLang refuses any other)',
        absent_or("silu"), required=False),
    EngineField(
        "rms_norm_eps", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                         f"{SGLANG_MODEL}: DFlashDecoderLayer"),
        "a number above 0",
        lambda value, config, target: is_number(value) and value > 0),
    EngineField(
        "rope_theta", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer (set_default_rope_theta)",
                       f"{SGLANG_MODEL}: DFlashAttention (get_rope_config)"),
        "a number above 0, at the top level or in rope_parameters (vLLM silently takes 1e6 "
        "when it is missing)",
        lambda value, config, target: is_number(value) and value > 0),
    EngineField(
        "rope_scaling", (f"{SGLANG_MODEL}: DFlashAttention (get_rope_config)",),
        "absent or null: the drafter was trained with plain RoPE",
        absent_or(None), required=False),
    EngineField(
        "max_position_embeddings", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                                    f"{SGLANG_MODEL}: DFlashAttention"),
        "a positive integer (vLLM reads it with no default; SGLang takes 32768)",
        lambda value, config, target: positive_int(value)),
    EngineField(
        "attention_bias", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                           f"{SGLANG_MODEL}: DFlashAttention"),
        "absent or false: true builds q/k/v/o biases the checkpoint does not have",
        absent_or(False), required=False),
    EngineField(
        "is_neox_style", (f"{VLLM_MODEL}: DFlashQwen3DecoderLayer",
                          f"{SGLANG_MODEL}: DFlashAttention"),
        "absent or true: the drafter's RoPE rotates halves (NeoX style); vLLM notes that a "
        "mismatch only shows as collapsed acceptance",
        absent_or(True), required=False),
    EngineField(
        "rope_is_neox_style", (f"{SGLANG_MODEL}: DFlashAttention",),
        "absent or true (SGLang reads it before is_neox_style)",
        absent_or(True), required=False),
    EngineField(
        "layer_types", (f"{VLLM_MODEL}: _resolve_layer_attention",
                        f"{SGLANG_MODEL}: _get_dflash_layer_attention_params",
                        "z-lab/dflash dflash/model.py: Qwen3DFlashAttention.__init__"),
        '"full_attention" once per drafter layer: a sliding layer is run causally by vLLM and '
        "SGLang, and the authors' code indexes the list by layer",
        full_attention_per_layer),
    EngineField(
        "is_causal", (f"{VLLM_MODEL}: _dflash_layer_causal",),
        "absent or false: the block attends both ways",
        absent_or(False), required=False),
    EngineField(
        "use_aux_hidden_state", (f"{VLLM_MODEL}: DFlashQwen3Model",),
        "absent or true: false drops fc, the target's features never enter",
        absent_or(True), required=False),
    EngineField(
        "vocab_size", (f"{VLLM_MODEL}: DFlashQwen3ForCausalLM",),
        "a positive integer, the target's (vLLM expects a draft-to-target id map otherwise)",
        same_as_target("vocab_size", positive_int)),
    EngineField(
        "draft_vocab_size", (f"{VLLM_MODEL}: DFlashQwen3ForCausalLM",),
        "absent, or vocab_size",
        lambda value, config, target: value is ABSENT or value == config.get("vocab_size"),
        required=False),
    EngineField(
        "num_target_layers", (SGLANG_PARSE, f"{SGLANG_MODEL}: DFlashDraftModel", AUTHORS),
        "a positive integer, the target's depth: SGLang checks target_layer_ids against it (the "
        "drafter's own depth when it is missing), the authors' code needs it",
        same_as_target("num_hidden_layers", positive_int)),
    EngineField(
        "block_size", (SGLANG_PARSE, f"{SGLANG_MODEL}: DFlashDraftModel", AUTHORS),
        "an integer of at least 2 at the top level (the authors' code reads it nowhere else; "
        "SGLang takes 16 when it finds none)",
        lambda value, config, target: is_integer(value) and value >= 2),
    EngineField(
        "dflash_config", (f"{VLLM_MODEL}: DFlashQwen3Model", SGLANG_PARSE, AUTHORS),
        "an object (the authors' code reads it with no default)",
        lambda value, config, target: isinstance(value, dict)),
    EngineField(
        "dflash_config.mask_token_id", (VLLM_MASK, f"{VLLM_MODEL}: DFlashQwen3Model",
                                        SGLANG_PARSE, AUTHORS),
        "an integer in 0..vocab_size-1, the token the drafter was trained with in its unknown "
        "slots (without it SGLang falls back to a mask token string, \"<|MASK|>\" by default)",
        valid_mask_token),
    EngineField(
        "dflash_config.target_layer_ids", (VLLM_AUX, f"{VLLM_MODEL}: _get_dflash_fc_input_size",
                                           SGLANG_PARSE, AUTHORS),
        "a non-empty list of target layers, 0-based, each below num_target_layers (vLLM adds 1 "
        "to each to find its capture points; the list's length sizes fc)",
        valid_layer_ids),
    EngineField(
        "eagle_aux_hidden_state_layer_ids", (VLLM_AUX,),
        "absent, or each of dflash_config.target_layer_ids plus 1: vLLM reads it first",
        lambda value, config, target: value is ABSENT or value == [
            i + 1 for i in value_at(config, "dflash_config.target_layer_ids") or []
            if is_integer(i)],
        required=False),
    EngineField(
        "dflash_config.block_size", (SGLANG_PARSE,),
        "absent, or block_size (SGLang reads it before the top-level one)",
        lambda value, config, target: value is ABSENT or value == config.get("block_size"),
        required=False),
    EngineField(
        "dflash_config.causal", (f"{VLLM_MODEL}: _dflash_layer_causal",),
        "absent or false",
        absent_or(False), required=False),
    EngineField(
        "dflash_config.use_swa", (f"{VLLM_MODEL}: _resolve_layer_attention",),
        "absent or false: true makes every layer a sliding window",
        absent_or(False), required=False),
    EngineField(
        "dflash_config.use_aux_hidden_state", (f"{VLLM_MODEL}: DFlashQwen3Model",),
        "absent or true (vLLM reads it before the top-level one)",
        absent_or(True), required=False),
    EngineField(
        "dflash_config.attention_sink_bias", (SGLANG_PARSE,
                                              f"{VLLM_MODEL}: DFlashQwen3DecoderLayer"),
        "absent or false: true adds a per-head sink the checkpoint does not have",
        absent_or(False), required=False),
    EngineField(
        "dflash_config.mask_token", (SGLANG_PARSE,),
        "absent, or a non-empty string",
        lambda value, config, target: value is ABSENT or (isinstance(value, str) and bool(value)),
        required=False),
    EngineField(
        "torch_dtype", (VLLM_DTYPE,),
        'a float type: "bfloat16", "float16" or "float32" (vLLM\'s "auto" dtype starts from it; '
        "a float32 one is cast down to the platform's preferred type)",
        lambda value, config, target: value in ("bfloat16", "float16", "float32")),
)


def field_value(config: dict, field: EngineField):
    """What `field` reads in `config` (RoPE's base may sit in rope_parameters)."""
    return rope_theta(config) if field.name == "rope_theta" else value_at(config, field.name)


def engine_field_problems(config: dict, target: dict | None = None) -> list[str]:
    """One line for every row of ENGINE_FIELDS that `config` (a drafter's `config.json`) breaks:
    the field, what it holds, what the engines expect and who reads it. Empty: it serves as is."""
    problems = []
    for field in ENGINE_FIELDS:
        value = field_value(config, field)
        if value is ABSENT and not field.required:
            continue
        if value is ABSENT or not field.rule(value, config, target):
            held = "missing" if value is ABSENT else f"got {json.dumps(value)}"
            problems.append(f"{field.name}: {held}; expected {field.expect} "
                            f"(read by {'; '.join(field.read_by)})")
    return problems
