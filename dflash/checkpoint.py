"""Checkpoints in the official layouts: safetensors and JSON configs, in and out.

A Hugging Face checkpoint folder holds `config.json` and its weights, either in one
`model.safetensors` or in shards listed by `model.safetensors.index.json` (a
`weight_map` from tensor name to file). Both the Qwen3 target and the DFlash
drafter are stored this way; each model file says only *which* official tensor
name fills *which* of its parameters (its name map), and this file does the rest:

- reading: check every name and shape against the map, memory-map each tensor,
  convert it on its device, and assign it into a model built on the `meta` device,
  so that an 8B model never exists twice in memory. Safetensors files hold raw
  numbers only: nothing is unpickled.
- writing: `config.json` and `model.safetensors`, each through a temporary file
  and a rename, so that a crash never leaves half a checkpoint.

Every failure is a `CheckpointError` whose message names the file (and tensor).
This file works on any `nn.Module` and imports no model.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint this code cannot load. The message is one line a CLI can print."""


# --------------------------------------------------------------------------- configs


def read_json(path: Path) -> dict:
    """Read a JSON file, turning every way it can fail into one clear line."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror})") from None


def refuse_unsupported_fields(raw: dict, source: str, expected_model_type: str) -> None:
    """Stop with a named field rather than silently computing something else."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("model_type", expected_model_type) != expected_model_type:
        raise CheckpointError(
            f"{source}: model_type={raw['model_type']!r} is not supported (only {expected_model_type!r})"
        )
    if raw.get("rope_scaling"):
        raise CheckpointError(f"{source}: rope_scaling={raw['rope_scaling']!r} is not supported")
    if raw.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
    layer_types = raw.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise CheckpointError(f"{source}: layer_types other than 'full_attention' are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act={raw['hidden_act']!r} is not supported (only 'silu')")
    rope_theta(raw, source)  # refuses a RoPE type other than the default


REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads")


def qwen3_fields(raw: dict, source: str, names: list[str]) -> dict:
    """The values of the fields `names` a Qwen3 `config.json` gives, checked, with the defaults it implies."""
    refuse_unsupported_fields(raw, source, expected_model_type="qwen3")
    missing = [name for name in REQUIRED_FIELDS if name not in raw]
    if missing:
        raise CheckpointError(f"{source}: missing required field(s) {', '.join(sorted(missing))}")
    values = {name: raw[name] for name in names if name in raw}
    values["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    theta = rope_theta(raw, source)
    if theta is not None:
        values["rope_theta"] = theta
    if not isinstance(getattr(torch, values["dtype"], None), torch.dtype):
        raise CheckpointError(f"{source}: dtype={values['dtype']!r} is not a torch dtype")
    if "head_dim" not in values:  # older configs leave it implicit
        values["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise CheckpointError(f"{source}: num_attention_heads={values['num_attention_heads']} is not a multiple "
                              f"of num_key_value_heads={values['num_key_value_heads']}")
    return values


def rope_theta(raw: dict, source: str) -> float | None:
    """RoPE's base: `rope_theta`, or inside `rope_parameters`, where newer transformers versions write it.

    Only the default RoPE is implemented; any other `rope_type` is refused by name.
    """
    params = raw.get("rope_parameters")
    if params is None:
        return raw.get("rope_theta")
    rope_type = params.get("rope_type", "default") if isinstance(params, dict) else params
    if rope_type != "default":
        raise CheckpointError(f"{source}: rope_parameters with rope_type={rope_type!r} is not supported "
                              "(only 'default')")
    if "rope_theta" not in params:
        raise CheckpointError(f"{source}: rope_parameters has no rope_theta")
    return params["rope_theta"]


# ---------------------------------------------------------------------------- reading


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor: read the shard index, or the single file."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files = {name: folder / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.exists():
                raise CheckpointError(f"{file}: shard listed in the index is missing")
        return files
    if single.exists():
        return {name: single for name in safetensors_names(single)}
    raise CheckpointError(f"{folder}: no model.safetensors and no model.safetensors.index.json")


def open_safetensors(file: Path):
    """A lazy handle on one safetensors file (tensors are read, memory-mapped, on demand)."""
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None


def safetensors_names(file: Path) -> list[str]:
    with open_safetensors(file) as handle:
        return list(handle.keys())


def load_into(model: nn.Module, folder: Path, name_map: dict[str, str], device, dtype: torch.dtype,
              skip: frozenset[str] = frozenset()) -> None:
    """Fill a `meta`-device `model` from a checkpoint folder, tensor by tensor.

    `name_map` maps every official tensor name to the parameter it fills. A tensor
    the map does not know (and that is not in `skip`, stored but unused), a missing
    one, or one of the wrong shape stops the load with its name and file.
    """
    files = {name: file for name, file in checkpoint_files(folder).items() if name not in skip}
    unexpected = sorted(set(files) - set(name_map))
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]!r}")
    missing = sorted(set(name_map) - set(files))
    if missing:
        raise CheckpointError(f"{folder}: missing tensor {missing[0]!r}")
    by_file: dict[Path, list[str]] = {}
    for name in files:
        by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        with open_safetensors(file) as handle:
            for name in names:
                placeholder = model.get_parameter(name_map[name])
                stored_shape = tuple(handle.get_slice(name).get_shape())
                if stored_shape != tuple(placeholder.shape):
                    raise CheckpointError(f"{file}: tensor {name!r} has shape {stored_shape}, "
                                          f"the config needs {tuple(placeholder.shape)}")
                tensor = handle.get_tensor(name).to(device=device, dtype=dtype)
                assign_parameter(model, name_map[name], tensor)


def checkpoint_folder(path, what: str) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a {what} folder")
    return path


def load_pretrained(cls, config, folder: Path, names: Callable[[nn.Module], dict[str, str]] | None, device,
                    dtype: torch.dtype, skip: frozenset[str] = frozenset()):
    """Build `cls(config)` on the `meta` device (no memory yet), fill it from `folder`, ready for inference.

    `names(model)` maps the checkpoint's tensor names to the model's; None: the same names.
    RoPE's frequencies are not stored: they are recomputed in float32 on `device`.
    """
    with torch.device("meta"):
        model = cls(config)
    name_map = names(model) if names is not None else {name: name for name, _ in model.named_parameters()}
    load_into(model, folder, name_map, device, dtype, skip)
    model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
    return model.eval()


def assign_parameter(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace a (meta) parameter by a real, frozen one: no copy into preallocated memory."""
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


# ---------------------------------------------------------------------------- writing


def save(folder, model: nn.Module, name_map: dict[str, str] | None, config: dict,
         dtype: torch.dtype | None = None) -> None:
    """Write `config.json` + `model.safetensors` into `folder`, each via a temp file and a rename.

    A crash mid-write leaves the previous files intact instead of half a checkpoint.
    `config.json` records the dtype the tensors were stored in. `name_map` None: the
    model's own parameter names.
    """
    from safetensors.torch import save_file

    if name_map is None:
        name_map = {name: name for name, _ in model.named_parameters()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for official, ours in name_map.items():
        tensor = model.get_parameter(ours).detach()
        tensors[official] = (tensor if dtype is None else tensor.to(dtype)).contiguous().cpu()
    dtype_name = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    config = {**config, "dtype": dtype_name, "torch_dtype": dtype_name}
    write_atomically(folder / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_json_atomically(folder / "config.json", config)


def write_json_atomically(target: Path, data) -> None:
    write_atomically(Path(target), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_atomically(target: Path, write: Callable[[str], None]) -> None:
    """Call `write(temp_path)` next to `target`, then rename over it (atomic on POSIX)."""
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(handle)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; checkpoints are meant to be shared
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
