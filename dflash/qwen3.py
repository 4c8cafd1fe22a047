"""Qwen3 from scratch: the config, the building blocks, the static KV cache, the model.

This file computes exactly what the official Qwen3 implementation computes. Reading
order: the config, the four building blocks (RMSNorm, RoPE, attention, MLP), the
decoder layer, the static KV cache, the model, and the table of official tensor
names it loads through. Reading and writing the official checkpoint layout
(safetensors and `config.json`) is `dflash/checkpoint.py`'s job; the DFlash
drafter (`dflash/drafter.py`) reuses the building blocks and the cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dflash import checkpoint
from dflash.checkpoint import CheckpointError

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
    dtype: str = "float32"  # the dtype the weights were saved in (informative only)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "Qwen3Config":
        """Build a config, refusing by name every field whose meaning we do not implement."""
        checkpoint.refuse_unsupported_fields(raw, source, expected_model_type="qwen3")
        missing = [name for name in REQUIRED_FIELDS if name not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing required field(s) {', '.join(sorted(missing))}")
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        values["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        if checkpoint.rope_theta(raw, source) is not None:
            values["rope_theta"] = checkpoint.rope_theta(raw, source)
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
    the longest sequence. The inverse frequencies are always float32, whatever dtype
    the weights are stored or computed in: that is what the official code does when
    it loads a checkpoint (checked with transformers 4.57.1 on a bf16 checkpoint,
    loaded in float32 and in bfloat16). Only a model cast with `.to(bfloat16)` in
    memory rounds them, which `round_frequencies` reproduces for fixtures made so.
    """

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.inverse_frequencies(), persistent=False)

    def inverse_frequencies(self, device=None) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        return 1.0 / (self.theta**exponents)  # (head_dim/2,)

    def round_frequencies(self, dtype: torch.dtype) -> None:
        """Round inv_freq through `dtype`, as an in-memory `.to(dtype)` of the official model does."""
        self.inv_freq = self.inv_freq.to(dtype).float()

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
        """Softmax attention of q over (k, v); `mask` (..., seq or 1, keys) is True where a query may look.

        Query head h reads key/value head h // groups. Rather than copying every key
        and value `groups` times (the whole cache, in every layer, every step), the
        groups of query heads that share a key/value head are stacked along the query
        axis: one key/value head then serves `groups * seq` query rows. Only the
        queries (a few rows) are rearranged; keys and values are read in place.

        `mask` may also be a pattern object with its own `attend(q, k, v)`, which
        computes the attention itself and skips what it masks (the drafter's training
        blocks, `dflash.train_kernels.AnchoredBlocks`).
        """
        batch, heads, seq, head_dim = q.shape
        if hasattr(mask, "attend"):
            out = mask.attend(q, k, v)  # (batch, heads, seq, head_dim)
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))  # (batch, seq, heads * head_dim) -> hidden
        groups = heads // self.num_kv_heads
        q = q.reshape(batch, self.num_kv_heads, groups * seq, head_dim)  # (batch, kv_heads, groups * seq, head_dim)
        if mask is not None and mask.shape[-2] == seq and groups > 1:
            repeats = (1,) * (mask.dim() - 2) + (groups, 1)
            mask = mask.repeat(repeats)  # (..., groups * seq, keys): the same rows for every query head of a group
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (batch, kv_heads, groups * seq, head_dim)
        out = out.reshape(batch, heads, seq, head_dim)  # unstack the groups: (batch, heads, seq, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))  # (batch, seq, heads * head_dim) -> hidden

    def forward(self, x, cos, sin, mask, cache: "KVCache | None", layer: int, slots: torch.Tensor):
        q = self.queries(x, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        if cache is not None:  # store this chunk at its slots, then attend over what the cache lets us read
            k, v = cache.write(layer, slots, k, v, mask.shape[-1])
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

    def forward(self, x, cos, sin, mask, cache, layer, slots):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------- the KV cache


class KVCache:
    """Preallocated keys and values, one pair of tensors per layer, written by position.

    `length` is the one truth about what the cache holds: the positions 0..length-1
    are the committed sequence. A forward pass writes its chunk at the positions
    right after them and reads the committed slots plus its own chunk; the caller
    then commits what it keeps: `extend(n)` after a plain step, and after a
    speculative step `trim(n)`, which cuts the rejected tail off by moving `length`
    back, in O(1). Rejected keys stay in memory but are never read again: the next
    chunk overwrites them before anything may look at them.

    How much is read is the one place where eager and compiled passes differ
    (`keys_to_read`): eager reads exactly the committed slots plus the chunk, which
    is the least work; a compiled pass needs the same shapes on every call, so it
    reads the whole buffer and a position mask hides every slot after the query
    (`fixed_shape`, set by whoever compiles).

    A draft tree is written the same way, one node per slot after the committed
    ones, but the nodes of the accepted path are then scattered among rejected
    siblings: `compact` moves them next to the committed slots before `extend`.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_length: int, head_dim: int,
                 device=None, dtype=torch.float32):
        shape = (batch, num_kv_heads, max_length, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.max_length = max_length
        self.length = 0
        self.fixed_shape = False
        self.flex_reads = False  # attend with FilledBlocks: read only the filled key blocks (fixed-shape passes)

    def keys_to_read(self, chunk: int) -> int:
        """How many slots attention reads for a chunk of `chunk` new positions."""
        if self.fixed_shape:
            return self.max_length  # a fixed shape; the position mask hides what lies ahead
        return self.length + chunk  # committed slots + the chunk itself

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_keys: int):
        """Store k, v (batch, kv_heads, seq, head_dim) at `positions`; return the first `num_keys` slots."""
        self.keys[layer].index_copy_(2, positions, k)
        self.values[layer].index_copy_(2, positions, v)
        return self.keys[layer][:, :, :num_keys], self.values[layer][:, :, :num_keys]

    def compact(self, sources: torch.Tensor, first: int) -> None:
        """Move the keys and values at slots `sources` (n,) to the contiguous slots first, ..., first + n - 1.

        The slots read are gathered before any is written, so sources and destinations
        may overlap. Nothing is committed: the caller extends the cache over them.
        """
        destinations = torch.arange(first, first + len(sources), device=sources.device)
        for buffer in self.keys + self.values:
            buffer.index_copy_(2, destinations, buffer.index_select(2, sources))

    def extend(self, count: int) -> None:
        """Commit the `count` positions just written after the committed ones."""
        if self.length + count > self.max_length:
            raise ValueError(f"cannot commit {count} more positions to a cache of {self.max_length} "
                             f"holding {self.length}")
        self.length += count

    def trim(self, length: int) -> None:
        """Forget everything from position `length` on (O(1): nothing is copied or freed).

        Trimming only shortens: a length past the committed one would commit slots never written.
        """
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache holding {self.length} positions to {length}")
        self.length = length


def causal_mask(positions: torch.Tensor, num_keys: int, key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """True where a query at `positions[i]` may attend to key slot j: j <= positions[i].

    Masking by position rather than by "what was written" is what lets a compiled
    pass read the whole buffer: every slot beyond the query is hidden, whatever
    stale or unwritten values it holds. `key_padding` (batch, >= num_keys), True
    for real tokens, hides left-padding in batched generation.
    """
    key_positions = torch.arange(num_keys, device=positions.device)
    mask = key_positions[None, :] <= positions[:, None]  # (seq, keys)
    if key_padding is not None:
        itself = key_positions[None, :] == positions[:, None]  # (seq, keys)
        # A padding query would otherwise see no key at all: a fully masked row, which
        # some attention kernels turn into NaN. Letting it see itself keeps it finite.
        mask = (mask[None, None] & key_padding[:, None, None, :num_keys]) | itself  # (batch, 1, seq, keys)
    return mask


class FilledBlocks:
    """A fixed-shape pass's mask, attended with FlexAttention so that only the filled part of the cache is read.

    A compiled pass reads the whole static buffer, so that its shapes never change;
    with plain attention that means loading every key and value up to `max_length`,
    however little of the buffer is filled. FlexAttention takes a *block mask*: for
    each block of queries, the list of key blocks worth visiting. Here that list is
    the key blocks up to the last key any query may see, counted on the device from
    the mask itself (no host sync, fixed shapes), and the mask decides within them.
    Key blocks past the filled part are never loaded, however long the buffer is.
    Used inside compiled passes of at most `QUERY_BLOCK` queries (every pass after
    the prefill) when a cache says `flex_reads` (`ModelRunner(flex_attention=True)`).
    """

    QUERY_BLOCK = KEY_BLOCK = 128

    def __init__(self, mask: torch.Tensor):
        self.mask = mask  # (seq or 1, keys) or (batch, 1, seq, keys), True where a query may look
        self.shape = mask.shape
        self.built = None  # the block mask, built by the first layer and shared by the others

    def block_mask(self, batch: int, seq: int, keys: int):
        """FlexAttention's block mask: one query block, the key blocks 0..last visible, the dense mask inside."""
        from torch.nn.attention.flex_attention import BlockMask

        dense = self.mask if self.mask.dim() == 4 else self.mask[None, None]  # (batch or 1, 1, seq or 1, keys)
        dense = dense[:, 0].expand(batch, seq, keys)  # (batch, seq, keys), a view
        key_index = torch.arange(keys, device=dense.device)
        last_visible = torch.where(dense.any(dim=1), key_index, 0).amax(dim=1)  # (batch,)
        num_blocks = (last_visible // self.KEY_BLOCK + 1).to(torch.int32)  # (batch,): the filled part, in blocks
        all_blocks = torch.arange(-(-keys // self.KEY_BLOCK), device=dense.device, dtype=torch.int32)

        def visible(b, h, query, key):
            return dense[b, query, key]

        return BlockMask.from_kv_blocks(  # shapes (batch, heads=1, query blocks=1) and (..., key blocks)
            num_blocks.view(batch, 1, 1), all_blocks.expand(batch, 1, 1, -1).contiguous(),
            BLOCK_SIZE=(self.QUERY_BLOCK, self.KEY_BLOCK), mask_mod=visible, seq_lengths=(seq, keys))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (batch, heads, seq, d) over k, v (batch, kv_heads, keys, d) -> (batch, heads, seq, d)."""
        from torch.nn.attention.flex_attention import flex_attention

        batch, _, seq, _ = q.shape
        if self.built is None:
            self.built = self.block_mask(batch, seq, k.shape[2])
        return flex_attention(q, k, v, block_mask=self.built, enable_gqa=True)

    @staticmethod
    def used_for(cache: "KVCache | None", seq: int) -> bool:
        """A compiled pass of at most QUERY_BLOCK queries over a cache that asks for it.

        Only there: the compiler turns FlexAttention into one fused kernel. A pass run
        eagerly (the prefill) reads only the committed slots anyway, or, over a
        fixed-shape cache, the plain mask (exact, and no kernel compiled per shape).
        """
        return (cache is not None and cache.flex_reads and seq <= FilledBlocks.QUERY_BLOCK
                and torch.compiler.is_compiling())


def chunk_mask_over_cache(slots: torch.Tensor, chunk_mask: torch.Tensor, num_keys: int) -> torch.Tensor:
    """True where query i of a chunk written at `slots` (seq,) may attend to key slot j.

    Every query sees every committed slot (those before the chunk's first slot) and,
    within the chunk, what `chunk_mask` (seq, seq) allows: query i sees the key of
    chunk entry j where chunk_mask[i, j]. A draft tree is such a chunk, with each
    node seeing its ancestors and itself. Like `causal_mask`, it depends on tensors
    only, so a compiled pass reading the whole buffer keeps one graph.
    """
    key_slots = torch.arange(num_keys, device=slots.device)
    committed = key_slots[None, :] < slots[0]  # (1, keys): the context before the chunk
    within = torch.zeros(chunk_mask.shape[0], num_keys, dtype=torch.bool, device=slots.device)
    within = within.index_copy(1, slots, chunk_mask)  # (seq, keys): column j of chunk_mask lands at slot slots[j]
    return committed | within  # (seq, keys)


# ------------------------------------------------------------------------ the model


class Qwen3(nn.Module):
    """The Qwen3 causal language model: embedding, decoder layers, final norm, LM head."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        if config.tie_word_embeddings:
            self.lm_head = None  # logits use embed_tokens.weight
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's matrix (vocab, hidden): the embedding's when they are tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project normed hidden states (..., hidden) onto the vocabulary (..., vocab)."""
        return F.linear(hidden, self.head_weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        capture_layers: Sequence[int] = (),
        logits_at: slice | torch.Tensor | str | None = None,
        key_padding: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        chunk_mask: torch.Tensor | None = None,
    ):
        """Run the model on input_ids (batch, seq).

        - `positions` (seq,): absolute positions of the tokens, shared by the batch
          (also the cache slots they are written to); default: right after what the
          cache has committed (0..seq-1 without a cache). The forward never commits:
          the caller moves `cache.length` (`extend`, `trim`) once it knows what to keep.
        - `slots`, `chunk_mask` (a draft tree): write token i at cache slot `slots[i]`
          rather than at its position, and let it see the committed slots plus the
          chunk entries `chunk_mask` (seq, seq) allows, not those of lower positions
          (`chunk_mask_over_cache`). Tree nodes of one depth share a position.
        - `capture_layers`: also return the hidden states after these decoder layers
          (0-based, repeats allowed), concatenated in the order asked:
          (batch, seq, len(layers) * hidden). The last layer's comes after the final
          norm, as the official `hidden_states[-1]` does.
        - `logits_at`: compute logits only at these sequence indices (prefill needs one);
          `"none"`: no logits at all, and no layer run past the last one captured
          (drafter training reads the target's features only).
        - `key_padding` (batch, keys): False for left-padding keys of batched prompts.
        Returns logits (batch, seq', vocab), or (logits, features) when capturing, or
        features alone with `logits_at="none"`.
        """
        batch, seq = input_ids.shape
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + seq, device=input_ids.device)
        slots = positions if slots is None else slots
        num_keys = cache.keys_to_read(seq) if cache is not None else seq
        if chunk_mask is None:
            mask = causal_mask(positions, num_keys, key_padding)
        else:
            mask = chunk_mask_over_cache(slots, chunk_mask, num_keys)
        if FilledBlocks.used_for(cache, seq):
            mask = FilledBlocks(mask)
        x = self.embed_tokens(input_ids)  # (batch, seq, hidden)
        cos, sin = self.rotary(positions, x.dtype)  # (seq, head_dim) each
        captured = {}
        features_only = isinstance(logits_at, str) and logits_at == "none"
        needed = max(capture_layers) + 1 if features_only else len(self.layers)
        for index, layer in enumerate(self.layers[:needed]):
            x = layer(x, cos, sin, mask, cache, index, slots)
            if index in capture_layers:
                captured[index] = x
        last = len(self.layers) - 1
        if last in captured:
            captured[last] = self.norm(x)  # the official hidden_states[-1] is after the final norm
        if features_only:
            return torch.cat([captured[i] for i in capture_layers], dim=-1)  # (batch, seq, n * hidden)
        hidden = self.norm(x if logits_at is None else x[:, logits_at])
        logits = self.logits(hidden)  # (batch, seq', vocab)
        if not capture_layers:
            return logits
        return logits, torch.cat([captured[i] for i in capture_layers], dim=-1)  # (batch, seq, n * hidden)

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
        config = Qwen3Config.from_dict(checkpoint.read_json(path / "config.json"), str(path / "config.json"))
        with torch.device("meta"):  # no memory yet: every weight arrives by assignment
            model = cls(config)
        # A tied checkpoint may still carry a copy of the embedding as its LM head: unused.
        unused = frozenset({"lm_head.weight"}) if config.tie_word_embeddings else frozenset()
        checkpoint.load_into(model, path, official_names(config), device, dtype, skip=unused)
        model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
        return model.eval()

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write `config.json` and `model.safetensors` in the official layout, atomically."""
        checkpoint.save(path, self, official_names(self.config), self.config.to_dict(), dtype)


# ------------------------------------------------------------- official tensor names

# The tensors of one decoder layer, named as in the official checkpoints (after
# `model.layers.{i}.`) and as in this file's modules (after `layers.{i}.`): the
# same dotted path, because the modules above are named after the official ones.
LAYER_TENSORS = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]
ATTENTION_BIASES = ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                    "self_attn.o_proj.bias"]


def official_names(config: Qwen3Config) -> dict[str, str]:
    """The checkpoint's tensor names -> this model's parameter names, for a given config."""
    names = {
        "model.embed_tokens.weight": "embed_tokens.weight",  # (vocab, hidden)
        "model.norm.weight": "norm.weight",  # (hidden,)
    }
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"  # (vocab, hidden)
    per_layer = LAYER_TENSORS + (ATTENTION_BIASES if config.attention_bias else [])
    for i in range(config.num_hidden_layers):
        for tensor in per_layer:
            names[f"model.layers.{i}.{tensor}"] = f"layers.{i}.{tensor}"
    return names
