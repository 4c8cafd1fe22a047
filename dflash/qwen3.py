"""Qwen3 from scratch: config, model, static KV cache and checkpoint loading.

This file computes exactly what the official Qwen3 implementation computes, and
reads (and writes) checkpoints in the official Hugging Face layout: a folder with
`config.json` and either `model.safetensors` or several shards listed in
`model.safetensors.index.json`.

Reading order: the config, the four building blocks (RMSNorm, RoPE, attention,
MLP), the decoder layer, the static KV cache, the model, and finally loading and
saving. The DFlash drafter (`dflash/drafter.py`) reuses the building blocks.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint this code cannot load. The message is one line a CLI can print."""


# --------------------------------------------------------------------------- config


@dataclass
class Qwen3Config:
    """Every `config.json` field that changes the math, named as in the official file."""

    vocab_size: int = 151936
    hidden_size: int = 4096  # width of the residual stream
    intermediate_size: int = 12288  # width of the SwiGLU MLP
    num_hidden_layers: int = 36
    num_attention_heads: int = 32  # query heads
    num_key_value_heads: int = 8  # key/value heads, shared by groups of query heads
    head_dim: int = 128  # NOT hidden_size // num_attention_heads in real Qwen3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    max_position_embeddings: int = 40960
    attention_bias: bool = False  # biases on the q/k/v/o projections
    dtype: str = "float32"  # the dtype the weights were saved in (see RotaryEmbedding)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "Qwen3Config":
        """Build a config, refusing by name every field whose meaning we do not implement."""
        refuse_unsupported_fields(raw, source, expected_model_type="qwen3")
        missing = [f.name for f in fields(cls) if f.name not in raw and f.name in REQUIRED_FIELDS]
        if missing:
            raise CheckpointError(f"{source}: missing required field(s) {', '.join(missing)}")
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        values["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if not isinstance(getattr(torch, values["dtype"], None), torch.dtype):
            raise CheckpointError(f"{source}: dtype={values['dtype']!r} is not a torch dtype")
        if "head_dim" not in values:  # older configs leave it implicit
            values["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]
        config = cls(**values)
        if config.num_attention_heads % config.num_key_value_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads={config.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={config.num_key_value_heads}"
            )
        return config

    def to_dict(self) -> dict:
        """The fields of an official Qwen3 `config.json`."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_act": "silu",
            **asdict(self),
            "rope_scaling": None,
            "sliding_window": None,
            "use_sliding_window": False,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
        }


REQUIRED_FIELDS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads",
}


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


# ------------------------------------------------------------------ building blocks


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square; computed in float32 as the official code does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE angles for absolute positions: cos/sin of `position * inv_freq`, computed on the fly.

    Computing them per call (a (seq, head_dim) outer product) needs no table sized for
    the longest sequence. One quirk is reproduced on purpose: the official code keeps
    `inv_freq` in a buffer that is cast to the checkpoint's dtype when the checkpoint
    is loaded, so a bfloat16 checkpoint rotates by bfloat16-rounded frequencies. We
    round the same way (`stored_dtype`), or our logits would drift from the reference.
    """

    def __init__(self, head_dim: int, theta: float, stored_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.head_dim, self.theta, self.stored_dtype = head_dim, theta, stored_dtype
        self.register_buffer("inv_freq", self.inverse_frequencies(), persistent=False)

    def inverse_frequencies(self, device=None) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)  # (head_dim/2,)
        return inv_freq.to(self.stored_dtype).float()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[..., None] * self.inv_freq  # (..., seq, head_dim/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., seq, head_dim): split-half layout
        if positions.dim() == 2:  # one row of positions per sequence
            angles = angles[:, None]  # (batch, 1, seq, head_dim): broadcasts over heads
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + head_dim/2]) by each position's angle (the official split-half RoPE)."""
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos + rotated_half * sin  # x: (batch, heads, seq, head_dim), cos/sin broadcast over heads


class Attention(nn.Module):
    """Grouped-query attention with Qwen3's per-head RMSNorm on queries and keys.

    Split into `queries`, `keys_values` and `attend` so that the DFlash drafter can
    project keys and values from the target's context features with the very same
    weights it uses for its own block.
    """

    def __init__(self, config: Qwen3Config):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def split_heads(self, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.split_heads(self.q_proj(x), self.num_heads)  # (batch, heads, seq, head_dim)
        return apply_rope(self.q_norm(q), cos, sin)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.split_heads(self.k_proj(x), self.num_kv_heads)  # (batch, kv_heads, seq, head_dim)
        v = self.split_heads(self.v_proj(x), self.num_kv_heads)  # (batch, kv_heads, seq, head_dim)
        return apply_rope(self.k_norm(k), cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Softmax attention of q over (k, v); `mask` is True where a query may look."""
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # (batch, heads, keys, head_dim)
        v = v.repeat_interleave(groups, dim=1)  # (batch, heads, keys, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (batch, heads, seq, head_dim)
        batch, _, seq, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))  # (batch, seq, hidden)

    def forward(self, x, cos, sin, mask, cache: "KVCache | None", layer: int, positions: torch.Tensor):
        q = self.queries(x, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        if cache is not None:  # store this chunk, then attend over everything stored so far
            k, v = cache.write(layer, positions, k, v, keys_needed=mask.shape[-1])
        return self.attend(q, k, v, mask)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and pre-norm MLP, each added back to the residual stream."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, cos, sin, mask, cache, layer, positions):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------- the KV cache


class KVCache:
    """Preallocated keys and values, one pair of tensors per layer, written by position.

    `length` counts the positions that hold committed tokens. Speculative decoding
    writes a whole block, keeps a prefix of it, and *trims*: `trim(n)` only moves the
    length, in O(1). The rejected entries stay in memory but can never be seen:
    attention masks every key at a position later than the query, and the next
    tokens overwrite those slots before anything is allowed to look at them.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_length: int, head_dim: int,
                 device=None, dtype=torch.float32):
        shape = (batch, num_kv_heads, max_length, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.max_length = max_length
        self.length = 0

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys_needed: int):
        """Store k, v (batch, kv_heads, seq, head_dim) at `positions`; return the first `keys_needed` slots."""
        self.keys[layer].index_copy_(2, positions, k)
        self.values[layer].index_copy_(2, positions, v)
        return self.keys[layer][:, :, :keys_needed], self.values[layer][:, :, :keys_needed]

    def trim(self, length: int) -> None:
        """Forget everything from position `length` on (O(1): nothing is copied or freed)."""
        if not 0 <= length <= self.max_length:
            raise ValueError(f"cannot trim a cache of {self.max_length} positions to {length}")
        self.length = length


def causal_mask(positions: torch.Tensor, num_keys: int, key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """True where a query at `positions[i]` may attend to key slot j: j <= positions[i].

    Masking by position rather than by "what was written" is what makes trimming free:
    a stale slot j beyond the committed length is later than every query that could
    see it before it is overwritten. `key_padding` (batch, num_keys), True for real
    tokens, hides left-padding in batched generation.
    """
    key_positions = torch.arange(num_keys, device=positions.device)
    mask = key_positions[None, :] <= positions[:, None]  # (seq, keys)
    if key_padding is not None:
        itself = key_positions[None, :] == positions[:, None]  # (seq, keys)
        # A padding query would otherwise see no key at all: a fully masked row, which
        # some attention kernels turn into NaN. Letting it see itself keeps it finite.
        mask = (mask[None, None] & key_padding[:, None, None, :]) | itself  # (batch, 1, seq, keys)
    return mask


# ------------------------------------------------------------------------ the model


class Qwen3(nn.Module):
    """The Qwen3 causal language model: embedding, decoder layers, final norm, LM head."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, getattr(torch, config.dtype))
        if config.tie_word_embeddings:
            self.lm_head = None  # logits use embed_tokens.weight
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project normed hidden states (..., hidden) onto the vocabulary (..., vocab)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        num_keys: int | None = None,
        capture_layers: Sequence[int] = (),
        logits_at: slice | torch.Tensor | None = None,
        key_padding: torch.Tensor | None = None,
    ):
        """Run the model on input_ids (batch, seq).

        - `positions` (seq,): absolute positions of the tokens, shared by the batch
          (also the cache slots they are written to); default 0..seq-1.
        - `cache`: write keys/values into it at `positions` and attend to all stored
          slots. `num_keys` bounds how many slots attention reads: the whole buffer
          (the default, a fixed shape for torch.compile) or just the filled prefix.
        - `capture_layers`: also return the hidden states after these decoder layers
          (0-based), concatenated on the feature axis: (batch, seq, len(layers) * hidden).
        - `logits_at`: compute logits only at these sequence indices (prefill needs one).
        Returns logits (batch, seq', vocab), or (logits, features) when capturing.
        """
        batch, seq = input_ids.shape
        if positions is None:
            positions = torch.arange(seq, device=input_ids.device)
        if cache is None:
            num_keys = seq
        elif num_keys is None:
            num_keys = cache.max_length
        mask = causal_mask(positions, num_keys, key_padding)
        x = self.embed_tokens(input_ids)  # (batch, seq, hidden)
        cos, sin = self.rotary(positions, x.dtype)  # (seq, head_dim) each
        captured = []
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, index, positions)
            if index in capture_layers:
                captured.append(x)
        x = self.norm(x if logits_at is None else x[:, logits_at])
        logits = self.logits(x)  # (batch, seq', vocab)
        if not capture_layers:
            return logits
        by_request = [captured[sorted(capture_layers).index(i)] for i in capture_layers]
        return logits, torch.cat(by_request, dim=-1)  # features: (batch, seq, n * hidden)

    def new_cache(self, max_length: int, batch: int = 1) -> KVCache:
        """A KV cache for `max_length` positions on this model's device and dtype."""
        c, weight = self.config, self.embed_tokens.weight
        return KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, max_length, c.head_dim,
                       device=weight.device, dtype=weight.dtype)

    # ------------------------------------------------------------ loading and saving

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype: torch.dtype = torch.float32) -> "Qwen3":
        """Load an official Qwen3 checkpoint folder (single file or sharded)."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a checkpoint folder")
        config = Qwen3Config.from_dict(read_json(path / "config.json"), str(path / "config.json"))
        with torch.device("meta"):  # no memory yet: every weight arrives by assignment
            model = cls(config)
        expected = official_names(model)
        load_checkpoint_into(model, path, expected, ignorable={"lm_head.weight"} if model.lm_head is None else set(),
                             device=device, dtype=dtype)
        model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
        return model.eval()

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write `config.json` and `model.safetensors` in the official layout, atomically."""
        names = official_names(self)
        tensors = {official: module_tensor(self, ours) for official, ours in names.items()}
        config = self.config.to_dict()
        save_checkpoint(path, tensors, config, dtype)


def official_names(model: Qwen3) -> dict[str, str]:
    """Map each official tensor name to our parameter name (ours drop the `model.` prefix)."""
    names = {}
    for ours, _ in model.named_parameters():
        official = ours if ours.startswith("lm_head.") else "model." + ours
        names[official] = ours
    return names


def module_tensor(module: nn.Module, name: str) -> torch.Tensor:
    return module.get_parameter(name).detach()


# ------------------------------------------------------- safetensors in and out


def checkpoint_files(path: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor: read the shard index, or the single file."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files = {name: path / file for name, file in weight_map.items()}
    elif (path / "model.safetensors").exists():
        files = None
    else:
        raise CheckpointError(f"{path}: no model.safetensors and no model.safetensors.index.json")
    if files is None:
        single = path / "model.safetensors"
        return {name: single for name in safetensors_names(single)}
    for file in sorted(set(files.values())):
        if not file.exists():
            raise CheckpointError(f"{file}: shard listed in the index is missing")
    return files


def safetensors_names(file: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            return list(handle.keys())
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None


def load_checkpoint_into(model: nn.Module, path: Path, expected: dict[str, str], ignorable: set[str],
                         device, dtype: torch.dtype) -> None:
    """Fill a meta-device `model` tensor by tensor, checking names and shapes.

    Each tensor is memory-mapped, converted to the compute dtype on its device, and
    assigned in place of the meta placeholder, so the model never exists twice.
    Safetensors files hold raw numbers only: nothing is unpickled.
    """
    from safetensors import safe_open

    files = checkpoint_files(path)
    unexpected = sorted(set(files) - set(expected) - ignorable)
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]!r}")
    missing = sorted(set(expected) - set(files))
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]!r}")
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        try:
            handle_context = safe_open(str(file), framework="pt", device="cpu")
        except Exception as err:
            raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None
        with handle_context as handle:
            for name in names:
                placeholder = model.get_parameter(expected[name])
                stored = handle.get_slice(name)
                if tuple(stored.get_shape()) != tuple(placeholder.shape):
                    raise CheckpointError(
                        f"{file}: tensor {name!r} has shape {tuple(stored.get_shape())}, "
                        f"the config needs {tuple(placeholder.shape)}"
                    )
                tensor = handle.get_tensor(name).to(device=device, dtype=dtype)
                assign_parameter(model, expected[name], tensor)


def assign_parameter(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)


def save_checkpoint(path, tensors: dict[str, torch.Tensor], config: dict, dtype: torch.dtype | None) -> None:
    """Write `config.json` + `model.safetensors` into `path`, each via a temp file and rename.

    A crash mid-write leaves the previous files intact instead of half a checkpoint.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    out = {name: (t if dtype is None else t.to(dtype)).contiguous().cpu() for name, t in tensors.items()}
    stored_dtype = next(iter(out.values())).dtype
    dtype_name = str(stored_dtype).removeprefix("torch.")
    config = {**config, "dtype": dtype_name, "torch_dtype": dtype_name}
    write_atomically(path / "model.safetensors", lambda tmp: save_file(out, tmp, metadata={"format": "pt"}))
    write_atomically(path / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))


def write_atomically(target: Path, write) -> None:
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
