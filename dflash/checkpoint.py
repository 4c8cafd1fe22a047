"""Checkpoints in the official layouts (safetensors, `config.json`), in and out, for any `nn.Module`."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from dflash.errors import CheckpointError


# A side file (a cache, a log, a lock, an index, a manifest) is small; one larger than this is
# not ours, and reading it whole could take the machine's memory.
SIDE_FILE_LIMIT = 64 * 2**20


def read_text(path: Path, error: type[Exception] = CheckpointError, what: str = "file",
              limit: int | None = None) -> str:
    """A file's text; every way reading it fails is one `error` naming the file. `limit` caps
    its size in bytes (side files), checked before a byte is read."""
    check_regular_file(path, error, what)
    try:
        if limit is not None and Path(path).stat().st_size > limit:
            raise error(f"{path}: the {what} is larger than {limit} bytes")
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{path}: cannot read the {what} ({err})") from None


def check_regular_file(path: Path, error: type[Exception] = CheckpointError,
                       what: str = "file") -> None:
    """Refuse what is there but is no regular file: opening a FIFO waits for a writer forever,
    reading a device may never end."""
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, a device or a socket)"
        raise error(f"{path}: the {what} is {kind}")


def parse_json(text: str, where, error: type[Exception] = CheckpointError):
    """`json.loads`, failing with one `error` line that starts with `where` (a file, or "file:line").
    Also refused: a key given twice in one object (which value was meant?) and nesting too deep
    for Python's parser, which would otherwise end in a RecursionError."""
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: unique_keys(pairs, where, error))
    except json.JSONDecodeError as err:
        raise error(f"{where}: not valid JSON ({err})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as err:  # a number of more than 4,300 digits
        if isinstance(err, error):
            raise
        raise error(f"{where}: not valid JSON ({err})") from None


def unique_keys(pairs: list[tuple[str, object]], where, error: type[Exception]) -> dict:
    """A JSON object's pairs as a dict, refusing a key that comes twice."""
    found = {}
    for key, value in pairs:
        if key in found:
            raise error(f"{where}: the key {json.dumps(key)} comes twice in one object")
        found[key] = value
    return found


def read_json(path: Path, error: type[Exception] = CheckpointError, what: str = "file",
              limit: int | None = None):
    """The project's one JSON file reader (configs, shard indexes, tokenizer configs, side files)."""
    return parse_json(read_text(path, error, what, limit), path, error)


def read_jsonl(path: Path, what: str, error: type[Exception] = CheckpointError,
               whole_lines_only: bool = False, limit: int | None = None):
    """("file:line", parsed JSON) for every non-blank line, so that errors name the line;
    `whole_lines_only` drops a last line without its newline: what a run killed mid-append
    leaves behind, so the records written whole still count."""
    text = read_text(path, error, what, limit)
    if whole_lines_only:
        text = text[: text.rfind("\n") + 1]
    return [(f"{path}:{number}", parse_json(line, f"{path}:{number}", error))
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_side_file(path: Path, what: str, check: Callable[[object], str | None],
                   lines: bool = False):
    """A file the project wrote for itself and reads back (a calibration cache, a training log),
    read with suspicion: a regular file under SIDE_FILE_LIMIT, UTF-8, valid JSON (a JSONL log
    counted up to its last whole line), and `check(value)` returning None (or what is wrong).
    Such a file only saves work, so a bad one counts as absent: None, with one note on stderr
    saying why, and the program goes on as if it were not there."""
    if not Path(path).exists():
        return None
    try:
        value = (read_jsonl(path, what, CheckpointError, whole_lines_only=True,
                            limit=SIDE_FILE_LIMIT) if lines
                 else read_json(path, CheckpointError, what, SIDE_FILE_LIMIT))
        problem = check(value)
    except CheckpointError as err:
        problem, value = str(err).removeprefix(f"{path}: "), None
    if problem is None:
        return value
    print(f"note: {path}: the {what} is ignored ({problem})", file=sys.stderr)
    return None


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is not a count


def is_number(value) -> bool:
    """A finite JSON number; an integer too large for a float (400 digits) is none: it would
    overflow the first time it met a float."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# What a field must be: (the rule as an error message says it, the test). Shared by the config checkers.
NON_NEGATIVE_INTEGER = ("an integer >= 0", lambda value: is_integer(value) and value >= 0)
# A size (a width, a count of layers or positions) or a token id: torch counts elements in 64-bit
# integers, and products of sizes must stay below that; no size a real model has comes near 2**31.
SIZE_LIMIT = 2**31 - 1
SIZE = ("a positive integer up to 2**31 - 1",
        lambda value: is_integer(value) and 0 < value <= SIZE_LIMIT)
TOKEN_ID = ("an integer in 0..2**31 - 1",
            lambda value: is_integer(value) and 0 <= value <= SIZE_LIMIT)
POSITIVE_NUMBER = ("a finite number above 0", lambda value: is_number(value) and value > 0)
BOOLEAN = ("true or false", lambda value: isinstance(value, bool))

# Every `config.json` field a Qwen3 model reads, and what it must be.
QWEN3_FIELD_RULES = {
    "vocab_size": SIZE, "hidden_size": SIZE, "intermediate_size": SIZE, "num_hidden_layers": SIZE,
    "num_attention_heads": SIZE, "num_key_value_heads": SIZE, "head_dim": SIZE,
    "max_position_embeddings": SIZE,
    "rms_norm_eps": POSITIVE_NUMBER, "rope_theta": POSITIVE_NUMBER,
    "tie_word_embeddings": BOOLEAN, "attention_bias": BOOLEAN}


def check_fields(values: dict, rules: dict, source, error: type[Exception] = CheckpointError) -> None:
    """Refuse the first of `values` that breaks its rule in `rules`, naming the file and the field; a field
    without a rule is not checked here. Run before any arithmetic, so a bad value never reaches torch."""
    for name, value in values.items():
        if name in rules and not rules[name][1](value):
            raise error(f"{source}: {name} must be {rules[name][0]}, got {json.dumps(value)}")


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
    layer_types = raw.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise CheckpointError(f"{source}: layer_types must be a list (one kind per layer), got "
                              f"{json.dumps(layer_types)}")
    others = {index: kind for index, kind in enumerate(layer_types) if kind != "full_attention"}
    if others:  # sliding-window layers, as some newer drafters are written, would attend to what they must not see
        kinds = " and ".join(repr(kind) for kind in dict.fromkeys(others.values()))
        raise CheckpointError(f"{source}: layer_types: layer(s) {', '.join(map(str, others))} are {kinds}; only "
                              f"'full_attention' is supported")
    missing = [name for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads") if name not in raw]
    if missing:
        raise CheckpointError(f"{source}: missing required field(s) {', '.join(sorted(missing))}")
    values = {name: raw[name] for name in names if name in raw}
    values["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if not isinstance(values["dtype"], str) or not isinstance(getattr(torch, values["dtype"], None), torch.dtype):
        raise CheckpointError(f"{source}: dtype={values['dtype']!r} is not a torch dtype")
    rope = raw.get("rope_parameters")  # where newer transformers versions write RoPE's base
    if rope is not None:
        if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
            raise CheckpointError(f"{source}: rope_parameters={rope!r} is not supported (only the default RoPE)")
        values["rope_theta"] = rope["rope_theta"]
    check_fields(values, QWEN3_FIELD_RULES, source)
    if "head_dim" not in values:  # older configs leave it implicit
        values["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
        if not values["head_dim"]:
            raise CheckpointError(f"{source}: hidden_size={raw['hidden_size']} is smaller than num_attention_heads="
                                  f"{raw['num_attention_heads']} (and no head_dim is given)")
    if values["head_dim"] % 2:  # RoPE turns a head's dimensions in pairs
        implicit = "" if "head_dim" in raw else " (hidden_size / num_attention_heads)"
        raise CheckpointError(f"{source}: head_dim{implicit} must be even (RoPE rotates pairs of "
                              f"dimensions), got {values['head_dim']}")
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise CheckpointError(f"{source}: num_attention_heads={values['num_attention_heads']} is not a multiple "
                              f"of num_key_value_heads={values['num_key_value_heads']}")
    return values


# The DFlash fields of a drafter's `config.json` (its layers' are Qwen3's), and what each must be.
DRAFTER_FIELD_RULES = {
    "num_target_layers": SIZE, "dflash_config.mask_token_id": TOKEN_ID,
    "dflash_config.target_layer_ids": (
        "a non-empty list of layer indices (integers in 0..2**31 - 1)",
        lambda ids: isinstance(ids, list) and bool(ids) and all(TOKEN_ID[1](i) for i in ids))}


def checkpoint_kind(raw) -> str | None:
    """"drafter" for a DFlash drafter's `config.json` (its DFlash fields, or its architecture's
    name), "target" for a plain Qwen3 model's; None when it says neither. Asked first, so a
    checkpoint given in the other's place is named for what it is, not for a field it lacks."""
    if not isinstance(raw, dict):
        return None
    architectures = raw.get("architectures")
    names = architectures if isinstance(architectures, list) else []
    if "dflash_config" in raw or "num_target_layers" in raw or "DFlashDraftModel" in names:
        return "drafter"
    if "Qwen3ForCausalLM" in names:
        return "target"
    return None


KINDS = {"target": "a target (Qwen3) checkpoint", "drafter": "a DFlash drafter checkpoint"}


def check_kind(raw, wanted: str, folder: Path) -> None:
    """Refuse a drafter's folder where a target's goes, or the reverse, in one line saying so."""
    found = checkpoint_kind(raw)
    if found is not None and found != wanted:
        raise CheckpointError(f"{folder}: this is {KINDS[found]}, not {KINDS[wanted]}")


def drafter_fields(raw: dict, source: str) -> dict:
    """The DFlash fields of a drafter's `config.json`, checked: block_size, num_target_layers, mask_token_id and
    target_layer_ids (None when the file names none)."""
    dflash = raw.get("dflash_config", {})
    if not isinstance(dflash, dict):
        raise CheckpointError(f"{source}: dflash_config must be an object, got {json.dumps(dflash)}")
    required = {"num_target_layers": raw.get("num_target_layers"),
                "dflash_config.mask_token_id": dflash.get("mask_token_id")}
    check_fields({**required, **{f"dflash_config.{name}": dflash[name] for name in dflash}}, DRAFTER_FIELD_RULES,
                 source)
    return {"block_size": block_size_of(raw, dflash, source), "num_target_layers": raw["num_target_layers"],
            "mask_token_id": dflash["mask_token_id"], "target_layer_ids": dflash.get("target_layer_ids")}


def block_size_of(raw: dict, dflash: dict, source: str) -> int:
    """The block size: at the top level, as the first releases write it, or in `dflash_config`, as newer ones do."""
    found = {name: value for name, value in (("block_size", raw.get("block_size")),
                                              ("dflash_config.block_size", dflash.get("block_size")))
             if value is not None}
    if not found:
        raise CheckpointError(f"{source}: block_size is missing (neither at the top level nor in dflash_config)")
    for name, value in found.items():
        if not is_integer(value) or value < 2:  # the last known token and one guess or more
            raise CheckpointError(f"{source}: {name} must be an integer of at least 2 (the last "
                                  f"token and one or more slots to draft), got {json.dumps(value)}")
    if len(set(found.values())) > 1:
        raise CheckpointError(f"{source}: block_size={raw['block_size']!r} and dflash_config.block_size="
                              f"{dflash['block_size']!r} disagree")
    name, value = next(iter(found.items()))
    positions = raw.get("max_position_embeddings")
    if is_integer(positions) and value > positions:  # a block past its positions was never trained
        raise CheckpointError(f"{source}: {name} {value} is more than the drafter's "
                              f"max_position_embeddings ({positions})")
    return value


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor: the shard index's, else the single file's (pickles are never read)."""
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if index.exists():
        files = {name: folder / file for name, file in shard_map(index).items()}
        for file in sorted(set(files.values())):
            if not file.exists():
                raise CheckpointError(f"{file}: shard listed in the index is missing")
        return files
    if single.exists():
        with open_safetensors(single) as handle:
            return {name: single for name in handle.keys()}
    raise CheckpointError(f"{folder}: no model.safetensors and no model.safetensors.index.json")


def shard_map(index: Path) -> dict[str, str]:
    """A shard index's `weight_map`, read as a side file (capped in size) and checked: tensor
    names to file names in the checkpoint's own folder ("../x.safetensors" would read another's)."""
    raw = read_json(index, what="shard index", limit=SIDE_FILE_LIMIT)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: no 'weight_map' object")
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise CheckpointError(f"{index}: weight_map[{json.dumps(name)}] must be a file name in "
                                  f"the checkpoint's folder, got {json.dumps(file)}")
    return weight_map


def check_tied_copy(folder: Path, copy: str, source: str) -> None:
    """With `tie_word_embeddings`, the official loaders (transformers' `tie_weights`, vLLM)
    use the embedding as the LM head and never read a stored `lm_head.weight`; one that differs
    from the embedding says the config and the weights disagree: refused, not silently dropped."""
    files = checkpoint_files(folder)
    if copy not in files or source not in files:
        return
    with open_safetensors(files[copy]) as copies, open_safetensors(files[source]) as sources:
        stored, used = copies.get_tensor(copy), sources.get_tensor(source)
        if stored.shape != used.shape or not torch.equal(stored.to(used.dtype), used):
            raise CheckpointError(f"{folder / 'config.json'}: tie_word_embeddings is true, but the "
                                  f"stored {copy} differs from {source} (which a tied model uses)")


def open_safetensors(file: Path):
    """A lazy handle on one safetensors file: tensors are memory-mapped when read, never unpickled."""
    check_regular_file(file, what="safetensors file")
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None


def load_into(model: nn.Module, folder: Path, name_map: dict[str, str], device, dtype: torch.dtype, *,
              skip: frozenset[str] = frozenset(), trainable: bool = False) -> None:
    """Fill a `meta`-device `model` tensor by tensor; `name_map`: official name -> parameter it fills. `skip`
    names tensors stored but unused; any other unknown, missing or misshapen tensor stops the load. The parameters
    are frozen unless `trainable` (a model fine-tuned from its checkpoint)."""
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
                stored, kind = tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype()
                needed = tuple(model.get_parameter(name_map[name]).shape)
                if stored != needed:
                    raise CheckpointError(f"{file}: tensor {name!r} has shape {stored}, the config needs {needed}")
                if kind not in FLOAT_DTYPES:  # an integer tensor cast to weights would be nonsense, silently
                    raise CheckpointError(f"{file}: tensor {name!r} is stored as {kind}, not as floating point")
                owner, _, leaf = name_map[name].rpartition(".")  # the meta parameter is replaced, not copied into
                tensor = handle.get_tensor(name).to(device=device, dtype=dtype)
                check_finite(tensor, name, file, handle)
                model.get_submodule(owner)._parameters[leaf] = nn.Parameter(tensor, requires_grad=trainable)


def check_finite(tensor: torch.Tensor, name: str, file: Path, handle) -> None:
    """Refuse a tensor holding NaN or Inf as it loads: one such weight turns every logit NaN, and
    the argmax of NaNs is a token all the same, so the run would end in garbage or an empty answer
    with exit status 0. A sum is finite only when every term is (NaN and Inf spread through it) and
    costs a fraction of `isfinite`, which writes a mask as large as the tensor (on a CPU, 0.6 ns a
    weight against 10); only a sum that is not finite, or overflowed, asks `isfinite` to be sure."""
    wide = torch.float64 if tensor.dtype == torch.float64 else torch.float32  # float16 sums overflow
    if torch.isfinite(tensor.sum(dtype=wide)) or torch.isfinite(tensor).all():
        return
    cast = " once cast to " + str(tensor.dtype).removeprefix("torch.")
    stored_finite = bool(torch.isfinite(handle.get_tensor(name)).all())  # only on the way out
    raise CheckpointError(f"{file}: tensor {name!r} holds NaN or Inf values"
                          f"{cast if stored_finite else ''}")


FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})  # safetensors' names


def checkpoint_folder(path, what: str, error: type[Exception] = CheckpointError) -> Path:
    """`path` as a Path, refused in one line when it is not a folder: missing, or a file."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {what} folder")
    if not path.is_dir():
        raise error(f"{path}: is a file, not a {what} folder")
    return path


def load_pretrained(cls, config, folder: Path, names: Callable[[nn.Module], dict[str, str]] | None, device,
                    dtype: torch.dtype, *, skip: frozenset[str] = frozenset(), trainable: bool = False):
    """`cls(config)` built on the `meta` device, so an 8B model never exists twice in memory,
    filled from `folder` (`names(model)`: the name map; None: ours). RoPE's frequencies are not
    stored: recomputed in float32 on `device`. What the config would build is checked first,
    against the tensors stored and the free memory."""
    stored = stored_shapes(folder, skip)
    check_layer_count(config, stored, folder)
    weights = sum(math.prod(shape) for shape in stored.values()) * dtype.itemsize
    check_memory(weights, device, f"{folder}: its weights in {str(dtype).removeprefix('torch.')}")
    try:
        with torch.device("meta"):
            model = cls(config)
    except RuntimeError as err:  # "Storage size calculation overflowed": sizes past 64 bits
        message = f"{folder / 'config.json'}: its sizes cannot be built ({err})"
        raise CheckpointError(message) from None
    name_map = names(model) if names is not None else {name: name for name, _ in model.named_parameters()}
    load_into(model, folder, name_map, device, dtype, skip=skip, trainable=trainable)
    model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
    return model.eval()


# ------------------------------------------------ what a load or a cache would take, asked first


def stored_shapes(folder: Path, skip: frozenset[str] = frozenset()) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from the safetensors headers alone: nothing is loaded."""
    files, shapes = checkpoint_files(folder), {}
    for file in dict.fromkeys(files.values()):
        with open_safetensors(file) as handle:
            shapes.update({name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()
                           if files.get(name) == file and name not in skip})
    return shapes


def check_layer_count(config, stored: dict[str, tuple[int, ...]], folder: Path) -> None:
    """Refuse a config with more or fewer decoder layers than the checkpoint stores (`layers.<i>.`
    in the tensors' names) before they are built: a billion layers take hours and all the memory
    to build, only to be refused at the first missing tensor. A drafter's are `config.layers`."""
    declared = getattr(getattr(config, "layers", config), "num_hidden_layers", None)
    found = {match.group(1) for name in stored if (match := LAYER_INDEX.search(name))}
    if declared is not None and declared != len(found):
        raise CheckpointError(f"{folder / 'config.json'}: num_hidden_layers is {declared}, but the "
                              f"checkpoint's tensors hold {len(found)} layers")


LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # model.layers.3.* or, a drafter's, layers.3.*


def available_memory(device) -> int | None:
    """Bytes `device` could still give this process: CUDA's free memory; on a Linux CPU the kernel's
    MemAvailable plus free swap, capped by a container's limit (cgroup v2). None: it cannot tell."""
    return device_memory(device, ("MemAvailable", "SwapFree"),
                         lambda cuda: torch.cuda.mem_get_info(cuda)[0])


def total_memory(device) -> int | None:
    """Bytes `device` has in all, taken or not: RAM and swap (or a container's limit); a GPU's."""
    return device_memory(device, ("MemTotal", "SwapTotal"),
                         lambda cuda: torch.cuda.get_device_properties(cuda).total_memory)


def device_memory(device, meminfo_fields: tuple[str, str], cuda_memory) -> int | None:
    """`cuda_memory(device)` on CUDA; on a Linux CPU the two /proc/meminfo fields summed (memory and
    swap), capped by a container's memory limit. None where it cannot tell."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_memory(device)
    if device.type != "cpu":
        return None
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        fields = (line.partition(":") for line in lines)  # "MemAvailable:   23789812 kB"
        meminfo = {name: int(rest.split()[0]) * 1024 for name, _, rest in fields}
    except (OSError, ValueError, IndexError):
        return None
    memory, swap = meminfo_fields
    if memory not in meminfo:
        return None
    room = container_room(total=memory == "MemTotal")
    return meminfo[memory] + meminfo.get(swap, 0) if room is None else min(room, meminfo[memory])


def container_room(total: bool) -> int | None:
    """A container's memory limit (cgroup v2), or what it still allows (not `total`); None: none."""
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - (0 if total else int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def check_memory(need: int, device, what: str, error: type[Exception] = CheckpointError, *,
                 in_all: bool = False) -> None:
    """Refuse, in one line, what would take more memory than `device` has free (or, `in_all`, has at
    all): refused here, it is a message; attempted, the kernel kills the process without one."""
    have = total_memory(device) if in_all else available_memory(device)
    if have is not None and need > have:
        raise error(f"{what} need about {need / 1e9:.3g} GB, and {torch.device(device)} has "
                    f"{have / 1e9:.3g} GB{' in all' if in_all else ' free'}")


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
    """Call `write(temp_path)` next to `target`, then rename over it: a crash never leaves half a file. The data
    reaches the disk (fsync) before the rename, and the rename before we return: a power cut keeps one whole file."""
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(handle)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; checkpoints are meant to be shared
        sync_to_disk(tmp)
        os.replace(tmp, target)
        sync_to_disk(target.parent)  # the folder's entry: the rename itself
    finally:
        Path(tmp).unlink(missing_ok=True)


def sync_to_disk(path) -> None:
    """Wait until a file's data (or a folder's entries) is on the disk, not only in the page cache."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def remove_partial_writes(folder: Path, names) -> list[Path]:
    """Delete what `write_atomically` leaves of `names` when killed mid-write (`NAME<random>.tmp`); return them."""
    leftovers = [path for name in names for path in Path(folder).glob(f"{name}*.tmp") if path.is_file()]
    for path in leftovers:
        path.unlink()
    return leftovers
