"""The DFlash drafter: a small block-diffusion model conditioned on the target's features.

One forward pass turns a block `[last verified token, MASK, MASK, ...]` into a guess
for every masked slot at once. It is a stack of Qwen3 decoder layers (the very
modules of `dflash/qwen3.py`) with two changes:

1. **KV injection.** The target's hidden states from a few of its layers are fused
   once per step into one context vector per token (`hidden_norm(fc(features))`).
   In *every* layer, the context is projected with that layer's own k/v weights and
   placed in front of the block's keys and values. Queries come only from the block.
2. **No causal mask.** The block attends to all of the context and all of itself:
   it is denoised as a whole, not predicted left to right.

The drafter owns no embedding and no LM head: it borrows the target's. Checkpoints
use the authors' released layout (tensors `fc.weight`, `hidden_norm.weight`,
`norm.weight`, `layers.{i}.*`; `config.json` with `block_size`, `num_target_layers`
and `dflash_config`), so drafters trained here load in their code and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from dflash import checkpoint
from dflash.checkpoint import CheckpointError
from dflash.qwen3 import DecoderLayer, KVCache, Qwen3, Qwen3Config, RMSNorm, RotaryEmbedding, attend


def default_target_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list[int]:
    """The authors' choice when a checkpoint names none: layers spread from 1 to L-3."""
    if num_drafter_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_drafter_layers - 1)) for i in range(num_drafter_layers)]


@dataclass
class DrafterConfig:
    """A Qwen3 config for the drafter's own layers, plus what ties it to its target."""

    layers: Qwen3Config  # width, heads, depth... of the drafter's decoder stack
    block_size: int  # tokens drafted per pass, the first of them already known
    num_target_layers: int  # depth of the target it was trained for
    mask_token_id: int  # the token that fills the unknown slots of a block
    target_layer_ids: list[int]  # target layers (0-based) whose outputs form the context

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "DrafterConfig":
        layers = Qwen3Config.from_dict(raw, source)
        for name in ("block_size", "num_target_layers"):
            if not isinstance(raw.get(name), int) or raw[name] < 1:
                raise CheckpointError(f"{source}: {name} must be a positive integer, got {raw.get(name)!r}")
        dflash = raw.get("dflash_config") or {}
        if not isinstance(dflash.get("mask_token_id"), int):
            raise CheckpointError(f"{source}: dflash_config.mask_token_id is missing")
        layer_ids = dflash.get("target_layer_ids") or default_target_layer_ids(
            raw["num_target_layers"], layers.num_hidden_layers)
        return cls(layers, raw["block_size"], raw["num_target_layers"], dflash["mask_token_id"], list(layer_ids))

    def to_dict(self) -> dict:
        """The authors' `config.json`: Qwen3 fields plus the DFlash ones."""
        return {
            **self.layers.to_dict(),
            "architectures": ["DFlashDraftModel"],
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids},
        }


class DrafterLayer(DecoderLayer):
    """A Qwen3 decoder layer whose attention also reads the target's context (KV injection)."""

    def forward(self, block, context, block_rope, context_rope, mask, cache, layer, context_slots, block_slots,
                num_keys, pattern):
        attn = self.self_attn
        normed = self.input_layernorm(block)  # the context is not normed again: hidden_norm did that
        q = attn.queries(normed, *block_rope)  # (batch, heads, block, head_dim): queries from the block only
        k_context, v_context = attn.keys_values(context, *context_rope)  # the context enters here...
        k_block, v_block = attn.keys_values(normed, *block_rope)  # ...beside the block's own keys/values
        if cache is None:
            k = torch.cat([k_context, k_block], dim=2)  # (batch, kv_heads, context + block, head_dim)
            v = torch.cat([v_context, v_block], dim=2)  # (batch, kv_heads, context + block, head_dim)
            heads = pattern.attend(q, k, v) if pattern is not None else attend(q, k, v, mask)
        else:  # the new context joins the cached one, then the block is written right after it
            cache.write(layer, context_slots, k_context, v_context, 0)
            k, v = cache.write(layer, block_slots, k_block, v_block, num_keys)
            heads = cache.attend(q, k, v, mask)
        block = block + attn.output(heads)  # heads: (batch, heads, block, head_dim)
        return block + self.mlp(self.post_attention_layernorm(block))


class Drafter(nn.Module):
    """The DFlash draft model. Call it with the target's raw features and the embedded block."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        c = config.layers
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        # Training at scale: keep only each layer's inputs, recompute the rest in the backward pass.
        self.recompute_layers = False

    def forward(
        self,
        target_features: torch.Tensor,
        block_embeddings: torch.Tensor,
        context_positions: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        pattern=None,
    ) -> torch.Tensor:
        """Denoise a block; return the drafter's final hidden states (batch, block, hidden).

        - `target_features` (batch, ctx, n_layers * hidden): the target's hidden states
          after `target_layer_ids`, for the context tokens not yet in `cache`.
        - `block_embeddings` (batch, block, hidden): the block through the target's embedding.
        - `context_positions` (ctx,) / `block_positions` (block,): absolute positions,
          which are also the cache slots written (or (batch, n) rows when training).
          With a cache read eagerly, the new context follows the committed one and the
          block follows the new context. The forward never commits: the caller extends
          the cache by the context it keeps; the block's slots are scratch.
        - `mask`: True where a block query may look; default: everything (no cache) or
          every slot up to the block's last position (with `cache`).
        - `pattern` (training, no cache): an attention pattern that computes the
          attention itself and skips what it hides (`dflash.train_kernels.AnchoredBlocks`).
        """
        context = self.hidden_norm(self.fc(target_features))  # (batch, ctx, hidden), once per step
        num_keys = None
        if cache is not None:
            num_keys = cache.keys_to_read(context.shape[1] + block_embeddings.shape[1])
            if mask is None:
                key_slots = torch.arange(num_keys, device=block_positions.device)
                mask = (key_slots <= block_positions[-1])[None, :]  # (1, keys): the context and the whole block
            mask = cache.prepare(mask, block_embeddings.shape[1])
        dtype = block_embeddings.dtype
        block_rope, context_rope = self.rotary(block_positions, dtype), self.rotary(context_positions, dtype)
        x = block_embeddings
        recompute = self.recompute_layers and torch.is_grad_enabled()
        for index, layer in enumerate(self.layers):
            inputs = (x, context, block_rope, context_rope, mask, cache, index, context_positions, block_positions,
                      num_keys, pattern)
            x = torch.utils.checkpoint.checkpoint(layer, *inputs, use_reentrant=False) if recompute \
                else layer(*inputs)
        return self.norm(x)

    def new_cache(self, max_length: int, batch: int = 1) -> KVCache:
        """A cache of the injected context's keys and values (the block's are overwritten each step)."""
        return KVCache.for_layers(self.config.layers, self.fc.weight, max_length, batch)

    # ------------------------------------------------------------ loading and saving

    @classmethod
    def from_pretrained(cls, path, target: Qwen3 | None = None, device="cpu",
                        dtype: torch.dtype = torch.float32) -> "Drafter":
        """Load a drafter in the authors' layout; with `target`, check first that it fits."""
        path = checkpoint.checkpoint_folder(path, "drafter checkpoint")
        config = DrafterConfig.from_dict(checkpoint.read_json(path / "config.json"), str(path / "config.json"))
        if target is not None:
            check_fits(config, target.config, str(path))
        return checkpoint.load_pretrained(cls, config, path, None, device, dtype)  # the released names are ours

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write the authors' layout (`config.json` + `model.safetensors`), atomically."""
        checkpoint.save(path, self, None, self.config.to_dict(), dtype)


def check_fits(drafter: DrafterConfig, target: Qwen3Config, source: str = "drafter") -> None:
    """Refuse a drafter trained for another target, naming both values."""
    pairs = [
        ("hidden_size", drafter.layers.hidden_size, target.hidden_size),
        ("vocab_size", drafter.layers.vocab_size, target.vocab_size),
        ("num_target_layers", drafter.num_target_layers, target.num_hidden_layers),
    ]
    for name, ours, theirs in pairs:
        if ours != theirs:
            target_name = "num_hidden_layers" if name == "num_target_layers" else name
            raise CheckpointError(f"{source}: drafter {name}={ours} does not fit the target's {target_name}={theirs}")
    for layer in drafter.target_layer_ids:
        if not 0 <= layer < target.num_hidden_layers:
            raise CheckpointError(f"{source}: target_layer_ids entry {layer} is outside the target's "
                                  f"{target.num_hidden_layers} layers")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise CheckpointError(f"{source}: mask_token_id={drafter.mask_token_id} is outside the target's "
                              f"vocab_size={target.vocab_size}")
