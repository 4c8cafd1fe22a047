"""Checkpoints in the official layouts (safetensors, `config.json`), in and out, for any `nn.Module`."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint this code cannot load. The message is one line a CLI can print."""


def read_text(path: Path, error: type[Exception] = CheckpointError, what: str = "file") -> str:
    """A file's text; every way reading it fails is one `error` naming the file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{path}: cannot read the {what} ({err})") from None


def parse_json(text: str, where, error: type[Exception] = CheckpointError):
    """`json.loads`, failing with one `error` line that starts with `where` (a file, or "file:line")."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{where}: not valid JSON ({err})") from None


def read_json(path: Path, error: type[Exception] = CheckpointError):
    """The project's one JSON file reader (configs, shard indexes, tokenizer configs)."""
    return parse_json(read_text(path, error), path, error)


def qwen3_fields(raw: dict, source: str, names: list[str]) -> dict:
    """The fields `names` of a Qwen3 `config.json`, defaults filled in; a field not implemented is refused by name."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    for field, supported in (("model_type", "qwen3"), ("hidden_act", "silu")):
        if raw.get(field, supported) != supported:
            raise CheckpointError(f"{source}: {field}={raw[field]!r} is not supported (only {supported!r})")
    for field in ("rope_scaling", "use_sliding_window"):
        if raw.get(field):
            raise CheckpointError(f"{source}: {field}={raw[field]!r} is not supported")
    if any(kind != "full_attention" for kind in raw.get("layer_types") or []):
        raise CheckpointError(f"{source}: layer_types other than 'full_attention' are not supported")
    missing = [name for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads") if name not in raw]
    if missing:
        raise CheckpointError(f"{source}: missing required field(s) {', '.join(sorted(missing))}")
    values = {name: raw[name] for name in names if name in raw}
    values["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if not isinstance(getattr(torch, values["dtype"], None), torch.dtype):
        raise CheckpointError(f"{source}: dtype={values['dtype']!r} is not a torch dtype")
    rope = raw.get("rope_parameters")  # where newer transformers versions write RoPE's base
    if rope is not None:
        if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
            raise CheckpointError(f"{source}: rope_parameters={rope!r} is not supported (only the default RoPE)")
        values["rope_theta"] = rope["rope_theta"]
    if "head_dim" not in values:  # older configs leave it implicit
        values["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise CheckpointError(f"{source}: num_attention_heads={values['num_attention_heads']} is not a multiple "
                              f"of num_key_value_heads={values['num_key_value_heads']}")
    return values


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor: the shard index's, else the single file's (pickles are never read)."""
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
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
        with open_safetensors(single) as handle:
            return {name: single for name in handle.keys()}
    raise CheckpointError(f"{folder}: no model.safetensors and no model.safetensors.index.json")


def open_safetensors(file: Path):
    """A lazy handle on one safetensors file: tensors are memory-mapped when read, never unpickled."""
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None


def load_into(model: nn.Module, folder: Path, name_map: dict[str, str], device, dtype: torch.dtype,
              skip: frozenset[str] = frozenset()) -> None:
    """Fill a `meta`-device `model` tensor by tensor; `name_map`: official name -> parameter it fills. `skip`
    names tensors stored but unused; any other unknown, missing or misshapen tensor stops the load."""
    files = {name: file for name, file in checkpoint_files(folder).items() if name not in skip}
    unexpected = sorted(set(files) - set(name_map))
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]!r}")
    missing = sorted(set(name_map) - set(files))
    if missing:
        raise CheckpointError(f"{folder}: missing tensor {missing[0]!r}")
    for file in dict.fromkeys(files.values()):  # each file opened once
        with open_safetensors(file) as handle:
            for name in [name for name, holder in files.items() if holder == file]:
                stored = tuple(handle.get_slice(name).get_shape())
                needed = tuple(model.get_parameter(name_map[name]).shape)
                if stored != needed:
                    raise CheckpointError(f"{file}: tensor {name!r} has shape {stored}, the config needs {needed}")
                owner, _, leaf = name_map[name].rpartition(".")  # the meta parameter is replaced, not copied into
                tensor = handle.get_tensor(name).to(device=device, dtype=dtype)
                model.get_submodule(owner)._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


def checkpoint_folder(path, what: str) -> Path:
    """`path` as a Path, refused in one line when it is not a folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a {what} folder")
    return path


def load_pretrained(cls, config, folder: Path, names: Callable[[nn.Module], dict[str, str]] | None, device,
                    dtype: torch.dtype, skip: frozenset[str] = frozenset()):
    """`cls(config)` built on the `meta` device, so an 8B model never exists twice in memory, filled from `folder`
    (`names(model)`: the name map; None: ours). RoPE's frequencies are not stored: recomputed in float32 on `device`."""
    with torch.device("meta"):
        model = cls(config)
    name_map = names(model) if names is not None else {name: name for name, _ in model.named_parameters()}
    load_into(model, folder, name_map, device, dtype, skip)
    model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
    return model.eval()


def save(folder, model: nn.Module, name_map: dict[str, str] | None, config: dict,
         dtype: torch.dtype | None = None) -> None:
    """Write `model.safetensors` and `config.json` (with the tensors' dtype), atomically; `name_map` None: ours."""
    name_map = name_map or {name: name for name, _ in model.named_parameters()}
    save_tensors(folder, {official: model.get_parameter(ours).detach().to(dtype=dtype)  # dtype None: as is
                          for official, ours in name_map.items()}, config)


def save_tensors(folder, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """`save` from the tensors themselves (a state dict gathered from many processes, say), with no model."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous().cpu() for name, tensor in tensors.items()}
    dtype_name = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    write_atomically(folder / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_json_atomically(folder / "config.json", {**config, "dtype": dtype_name, "torch_dtype": dtype_name})


def write_json_atomically(target: Path, data) -> None:
    write_atomically(Path(target), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_atomically(target: Path, write: Callable[[str], None]) -> None:
    """Call `write(temp_path)` next to `target`, then rename over it: a crash never leaves half a file."""
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(handle)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; checkpoints are meant to be shared
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
