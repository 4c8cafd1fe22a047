"""Qwen3 from scratch: the config, the building blocks, the static KV cache, the model.

It computes exactly what the official Qwen3 implementation computes. The checkpoint layout is
`dflash/checkpoint.py`'s job; the drafter (`dflash/drafter.py`) reuses the blocks and the cache.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from dflash import checkpoint
from dflash.errors import UsageError


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
    dtype: str = "float32"  # the dtype the weights were saved in (informative only)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "Qwen3Config":
        """Build a config from `config.json`, refusing by name every field we do not implement."""
        return cls(**checkpoint.qwen3_fields(raw, source, [f.name for f in fields(cls)]))

    def to_dict(self) -> dict:
        """The fields of an official Qwen3 `config.json`."""
        layer_types = ["full_attention"] * self.num_hidden_layers
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                **asdict(self), "rope_scaling": None, "sliding_window": None,
                "use_sliding_window": False, "layer_types": layer_types}


# ------------------------------------------------------------------ building blocks


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square; in float32, as the official code does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE's cos/sin of `position * inv_freq`, computed per call (no table sized for the longest
    sequence). `inv_freq` stays float32 whatever the weights' dtype, as in the official code."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.inverse_frequencies(), persistent=False)

    def inverse_frequencies(self, device=None) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.theta**(exponents / self.head_dim))  # (head_dim/2,)

    def _apply(self, fn, recurse=True):
        """`.to()`, `.to_empty()`... move `inv_freq` but keep it exact, in float32 (bf16's is 3.5
        rad off at 3,000)."""
        super()._apply(fn, recurse)
        self.inv_freq = self.inverse_frequencies(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> "Rope":
        angles = positions.float()[..., None] * self.inv_freq  # (..., seq, head_dim/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., seq, head_dim): split-half layout
        if positions.dim() == 2:  # one row of positions per sequence
            angles = angles[:, None]  # (batch, 1, seq, head_dim): broadcasts over heads
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + head_dim/2]) by each position's angle (split-half RoPE)."""
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos + rotated_half * sin  # x: (batch, heads, seq, hd); cos/sin broadcast over heads


Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin at a chunk's positions, (..., seq, hd) each
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""How a pass's queries read keys: (q, k, v) -> heads, knowing which keys each query may see. One
per pass, shared by its layers. Three exist: `masked` below (SDPA, the default everywhere),
`filled_blocks` (dflash/flex_reads.py: FlexAttention visiting only a long cache's filled key blocks)
and `AnchoredBlocks.attend` (dflash/train_kernels.py: training's blocks, skipping hidden keys)."""


def masked(mask) -> Attend:
    """SDPA itself, `mask` bound: a boolean (..., seq or 1, keys), True where a query may look; a
    causal bias (`causal_lower_right`); or None, every key (the last two keep the fused kernels
    open). q (batch, heads, seq, d), k, v (batch, kv_heads, keys, d): query head h reads key/value
    head h // (heads // kv_heads), by `enable_gqa`, without copying keys and values."""
    return functools.partial(F.scaled_dot_product_attention, attn_mask=mask, enable_gqa=True)


class Attention(nn.Module):
    """Grouped-query attention with Qwen3's per-head RMSNorm on queries and keys, in three parts
    (`queries`, `keys_values`, `output`): the drafter projects the target's context with these."""

    def __init__(self, config: Qwen3Config, layer_index: int = 0):
        super().__init__()
        c, bias = config, config.attention_bias
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.head_dim
        self.layer_index = layer_index  # which layer's keys and values it writes in a KVCache
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def queries(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)  # (b, seq, heads, hd)
        return apply_rope(self.q_norm(q.transpose(1, 2)), *rope)  # (batch, heads, seq, head_dim)

    def keys_values(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq, _ = x.shape
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)  # (b, seq, kv_h, hd)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)  # (b, seq, kv_h, hd)
        k = self.k_norm(k.transpose(1, 2))  # (b, kv_h, seq, hd)
        return apply_rope(k, *rope), v.transpose(1, 2)  # (b, kv_h, seq, hd) each

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        batch, _, seq, _ = heads.shape  # heads: (batch, heads, seq, head_dim)
        return self.o_proj(heads.transpose(1, 2).reshape(batch, seq, -1))  # (b, seq, heads * hd)

    def forward(self, x: torch.Tensor, rope: Rope, attend: Attend, cache: "KVCache | None",
                slots: torch.Tensor | None) -> torch.Tensor:
        """x (batch, seq, hidden); with a `cache`, the chunk's keys and values are written at
        `slots` (seq,) and attention reads every key the cache hands back."""
        q = self.queries(x, rope)
        k, v = self.keys_values(x, rope)
        if cache is not None:
            k, v = cache.write(self.layer_index, slots, k, v)
        return self.output(attend(q, k, v))


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

    def __init__(self, config: Qwen3Config, layer_index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, rope: Rope, attend: Attend, cache: "KVCache | None",
                slots: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attend, cache, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------- the KV cache


class KVCache:
    """Preallocated keys and values, one pair of tensors per layer, written by position.
    Slots 0..length-1 hold the committed sequence. A pass writes its chunk right after them; the
    caller commits what it keeps (`commit`) or cuts the rejected tail (`trim`), overwritten before
    anything reads it. A pass reads the committed slots and its chunk, unless its caller fixes how
    many (`read_limit`: a compiled pass needs one shape, so reads a bucket of slots under a position
    mask hiding every slot past the query, `ModelRunner.run_pass`)."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_length: int,
                 head_dim: int, *, device=None, dtype=torch.float32):
        shape = (batch, num_kv_heads, max_length, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.max_length, self.length = max_length, 0
        self.read_limit: int | None = None  # the slots a pass reads, when its caller fixes them

    @classmethod
    def for_layers(cls, config: Qwen3Config, like: torch.Tensor, max_length: int,
                   batch: int = 1) -> "KVCache":
        """A cache for a stack of layers shaped by `config`, on the device and dtype of `like`."""
        return cls(config.num_hidden_layers, batch, config.num_key_value_heads, max_length,
                   config.head_dim, device=like.device, dtype=like.dtype)

    def keys_to_read(self, chunk: int) -> int:
        """How many slots attention reads for `chunk` new positions: the committed ones and the
        chunk, or the `read_limit` the caller fixed (its position mask hides the rest)."""
        return self.length + chunk if self.read_limit is None else self.read_limit

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store a chunk's k, v (batch, kv_heads, seq, head_dim) at `slots` (seq,), after the
        committed ones; return the first `keys_to_read(seq)` slots of the layer's keys, values."""
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)
        num_keys = self.keys_to_read(len(slots))
        return self.keys[layer][:, :, :num_keys], self.values[layer][:, :, :num_keys]

    def compact(self, sources: torch.Tensor, first: int) -> None:
        """Move a draft tree's accepted path from `sources` (n,) to first..first+n-1 (gathered
        first: they may overlap)."""
        destinations = torch.arange(first, first + len(sources), device=sources.device)
        for buffer in self.keys + self.values:
            buffer.index_copy_(2, destinations, buffer.index_select(2, sources))

    def commit(self, count: int) -> None:
        """Commit the `count` positions just written after the committed ones."""
        if self.length + count > self.max_length:
            raise ValueError(f"cannot commit {count} more positions to a cache of "
                             f"{self.max_length} holding {self.length}")
        self.length += count

    def trim(self, length: int) -> None:
        """Forget from position `length` on, in O(1); only shortens (longer: unwritten slots)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache holding {self.length} positions to {length}")
        self.length = length


def causal_mask(positions: torch.Tensor, num_keys: int,
                key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """True where a query at `positions[i]` may attend to key slot j: j <= positions[i], whatever
    the slot holds. `key_padding` (batch, >= num_keys), True for real tokens, hides left-padding."""
    key_positions = torch.arange(num_keys, device=positions.device)
    mask = key_positions[None, :] <= positions[:, None]  # (seq, keys)
    if key_padding is not None:
        itself = key_positions[None, :] == positions[:, None]  # (seq, keys)
        # A padding query sees itself: a fully masked row turns into NaN in some attention kernels.
        mask = (mask[None, None] & key_padding[:, None, None, :num_keys]) | itself  # (b,1,seq,keys)
    return mask


def default_causal_mask(positions: torch.Tensor, cache: KVCache | None,
                        key_padding: torch.Tensor | None, after_the_committed: bool):
    """The mask of a forward given no attention: queries at `positions` (seq,) read the committed
    keys and themselves, causally. Where they are the last keys read (`after_the_committed`, no
    padding, no fixed-shape read), a causal bias aligned to the lower right, which SDPA's fused
    kernels take; otherwise a boolean mask (`causal_mask`)."""
    seq = len(positions)
    num_keys = cache.keys_to_read(seq) if cache is not None else seq
    committed = cache.length if cache is not None else 0
    if after_the_committed and key_padding is None and num_keys == committed + seq:
        return causal_lower_right(seq, num_keys)
    return causal_mask(positions, num_keys, key_padding)


def tree_mask_over_cache(slots: torch.Tensor, tree_mask: torch.Tensor,
                         num_keys: int) -> torch.Tensor:
    """True where query i of a chunk written at `slots` (seq,) may attend to key slot j: every query
    sees the committed slots and, within the chunk, entry j where tree_mask[i, j] (a draft tree's
    ancestors and itself). Tensors only, so a compiled pass keeps one graph."""
    key_slots = torch.arange(num_keys, device=slots.device)
    committed = key_slots[None, :] < slots[0]  # (1, keys): the context before the chunk
    within = torch.zeros(tree_mask.shape[0], num_keys, dtype=torch.bool, device=slots.device)
    within = within.index_copy(1, slots, tree_mask)  # (seq, keys): tree_mask's column j at slots[j]
    return committed | within  # (seq, keys)


# ------------------------------------------------------------------------ the model


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token, the first index on a tie: (..., vocab) -> (...); `max` is faster on CPU."""
    return logits.max(dim=-1).indices


class Qwen3(nn.Module):
    """The Qwen3 causal language model: embedding, decoder layers, final norm, LM head."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        tied = c.tie_word_embeddings  # then the logits use embed_tokens.weight
        self.lm_head = None if tied else nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's matrix (vocab, hidden): the embedding's when they are tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project normed hidden states (..., hidden) onto the vocabulary (..., vocab)."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head  # as `head_weight`
        return F.linear(hidden, head.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, *, capture_layers: Sequence[int] = (),
                attend: Attend | None = None, slots: torch.Tensor | None = None,
                key_padding: torch.Tensor | None = None,
                last_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run input_ids (batch, seq); return the normed hidden states and `capture_layers`' outputs
        side by side. `positions` (seq,), by default right after the cache's committed ones, are
        also the slots written (nothing is committed). `attend` defaults to causal attention over
        the cache (`key_padding` (batch, keys) hides left padding); a draft tree passes its own and
        writes token i at `slots[i]`. `last_layer` stops early, its output then not normed."""
        after_the_committed = positions is None
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        if attend is None:
            attend = masked(default_causal_mask(positions, cache, key_padding, after_the_committed))
        slots = positions if slots is None else slots
        x = self.embed_tokens(input_ids)  # (batch, seq, hidden)
        rope = self.rotary(positions, x.dtype)  # cos, sin: (seq, head_dim) each
        captured = [None] * len(capture_layers)  # only these kept: a long prefill holds no other
        layers = self.layers if last_layer is None else self.layers[:last_layer + 1]
        for index, layer in enumerate(layers):
            x = layer(x, rope, attend, cache, slots)
            if index == len(self.layers) - 1:
                x = self.norm(x)  # the official hidden_states[-1] is after the final norm
            for slot, wanted in enumerate(capture_layers):  # a layer may be asked for twice
                if wanted == index:
                    captured[slot] = x
        features = torch.cat(captured, dim=-1) if capture_layers else None
        return x, features  # (batch, seq, hidden), (batch, seq, n * hidden)

    def check_request(self, prompt_ids: Sequence[int], max_new_tokens: int,
                      where: str = "prompt") -> None:
        """Refuse, in one line naming the problem, what this model cannot serve: an empty prompt,
        an id it has no embedding for, more positions than it was built for. Cheap (no tensor, no
        memory probe), so every loop call checks it."""
        n, limit = len(prompt_ids), self.config.max_position_embeddings
        vocab = self.config.vocab_size
        if n == 0:
            raise UsageError(f"{where}: the prompt is empty")
        if n >= limit:
            raise UsageError(f"{where}: the prompt's {n} tokens leave no room for new ones in the "
                             f"model's max_position_embeddings ({limit})")
        if max_new_tokens <= 0:
            raise UsageError(f"max_new_tokens must be positive, got {max_new_tokens}")
        if max_new_tokens > limit - n:
            raise UsageError(f"{where}: the prompt's {n} tokens and max_new_tokens "
                             f"{max_new_tokens} exceed the model's max_position_embeddings "
                             f"({limit}): at most {limit - n} new tokens fit")
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            outside = next(token for token in prompt_ids if not 0 <= token < vocab)
            raise UsageError(f"{where}: token id {outside} is outside the vocabulary "
                             f"(0..{vocab - 1})")

    def new_cache(self, max_length: int, batch: int = 1) -> KVCache:
        """A KV cache for `max_length` positions on this model's device and dtype."""
        return KVCache.for_layers(self.config, self.embed_tokens.weight, max_length, batch)

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype: torch.dtype = torch.float32) -> "Qwen3":
        """Load an official Qwen3 checkpoint folder (single file or sharded)."""
        path = checkpoint.checkpoint_folder(path, "checkpoint")
        file = path / "config.json"
        raw = checkpoint.read_json(file)
        checkpoint.check_kind(raw, "target", path)
        config = Qwen3Config.from_dict(raw, str(file))
        unused = frozenset({"lm_head.weight"} if config.tie_word_embeddings else ())  # a tied copy
        if config.tie_word_embeddings:
            checkpoint.check_tied_copy(path, "lm_head.weight", "model.embed_tokens.weight")
        return checkpoint.load_pretrained(cls, config, path, official_names, device, dtype,
                                          skip=unused)

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write `config.json` and `model.safetensors` in the official layout, atomically."""
        checkpoint.save(path, self, official_names(self), self.config.to_dict(), dtype)


def official_names(model: nn.Module) -> dict[str, str]:
    """The checkpoint's tensor names -> this model's: the same paths, under `model.` but lm_head."""
    return {name if name.startswith("lm_head.") else f"model.{name}": name
            for name, _ in model.named_parameters()}
