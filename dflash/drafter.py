"""The DFlash drafter: a small block-diffusion model conditioned on the target's features.

One pass turns a block `[last verified token, MASK, ...]` into a guess for every masked slot.
Qwen3 decoder layers with two changes: the target's features, one context vector per token,
enter every layer as keys and values before the block's own (KV injection), and no causal mask
inside the block. The embedding and LM head are the target's; checkpoints use the authors' layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from dflash import checkpoint
from dflash.errors import CheckpointError
from dflash.qwen3 import (Attend, DecoderLayer, KVCache, Qwen3, Qwen3Config, RMSNorm, Rope,
                          RotaryEmbedding, masked)


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
        layers, fields = Qwen3Config.from_dict(raw, source), checkpoint.drafter_fields(raw, source)
        depth, drafter_depth = fields["num_target_layers"], layers.num_hidden_layers
        layer_ids = fields["target_layer_ids"] or default_target_layer_ids(depth, drafter_depth)
        return cls(layers, fields["block_size"], depth, fields["mask_token_id"], list(layer_ids))

    def to_dict(self) -> dict:
        """The authors' `config.json`: Qwen3 fields plus the DFlash ones."""
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        return {**self.layers.to_dict(), "architectures": ["DFlashDraftModel"],
                "block_size": self.block_size, "num_target_layers": self.num_target_layers,
                "dflash_config": dflash}


class DrafterLayer(DecoderLayer):
    """A Qwen3 decoder layer whose attention also reads the target's context (KV injection)."""

    def forward(self, block: torch.Tensor, context: torch.Tensor, rope: Rope, attend: Attend,
                cache: KVCache | None, slots: torch.Tensor | None) -> torch.Tensor:
        """block (batch, B, hidden) and context (batch, ctx, hidden) -> block; `rope` covers
        [context; block]; with a `cache`, both are written at `slots` (ctx + B,)."""
        attn, seq = self.self_attn, block.shape[1]
        normed = self.input_layernorm(block)  # not the context: hidden_norm did that
        block_rope = (rope[0][..., -seq:, :], rope[1][..., -seq:, :])  # the block's: (..., B, hd)
        q = attn.queries(normed, block_rope)  # (batch, heads, B, hd): from the block only
        # The context enters here: its keys and values go before the block's, one projection.
        k, v = attn.keys_values(torch.cat([context, normed], dim=1), rope)  # (b, kv_h, ctx + B, hd)
        if cache is not None:  # the new context joins the cached one, the block right after it
            k, v = cache.write(attn.layer_index, slots, k, v)
        block = block + attn.output(attend(q, k, v))  # (b, heads, B, hd) -> (batch, B, hidden)
        return block + self.mlp(self.post_attention_layernorm(block))


class Drafter(nn.Module):
    """The DFlash draft model. Call it with the target's raw features and the embedded block."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        c, self.config = config.layers, config
        self.fc = nn.Linear(len(config.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        self.recompute_layers = False  # training at scale: keep layers' inputs, recompute the rest

    def forward(self, features: torch.Tensor, block_embeddings: torch.Tensor,
                context_positions: torch.Tensor, block_positions: torch.Tensor, *,
                cache: KVCache | None = None, attend: Attend | None = None,
                context_slots: torch.Tensor | None = None) -> torch.Tensor:
        """Denoise a block; return the drafter's final hidden states (batch, block, hidden).
        `features` (batch, ctx, n_layers * hidden), the target's, cover the context not yet in
        `cache`. Positions ((n,), or (batch, n) in training) are also the slots written, context and
        block in one write (`context_slots` may move the context's); the caller commits the context
        it keeps. `attend` defaults to every key up to the block's end: eagerly, all keys read."""
        context = self.hidden_norm(self.fc(features))  # (batch, ctx, hidden), once per step
        # ([batch,] ctx): the context's positions, batched as the block's
        context_positions = context_positions.expand(*block_positions.shape[:-1], -1)
        positions = torch.cat([context_positions, block_positions], dim=-1)  # ([batch,] ctx + B)
        if attend is None:  # a cache may be read past the block (`read_limit`): the mask hides that
            attend = masked(None if cache is None else
                            cached_block_mask(cache, positions.shape[-1], block_positions))
        # (ctx + B,): where the context and the block are written
        slots = positions if context_slots is None else torch.cat([context_slots, block_positions])
        rope = self.rotary(positions, block_embeddings.dtype)  # cos, sin: ([batch, 1,] ctx + B, hd)
        x = block_embeddings
        recompute = self.recompute_layers and torch.is_grad_enabled()
        for layer in self.layers:
            inputs = (x, context, rope, attend, cache, slots)
            x = (torch.utils.checkpoint.checkpoint(layer, *inputs, use_reentrant=False) if recompute
                 else layer(*inputs))
        return self.norm(x)

    @classmethod
    def from_pretrained(cls, path, target: Qwen3 | None = None, device="cpu",
                        dtype: torch.dtype = torch.float32, trainable: bool = False) -> "Drafter":
        """Load a drafter in the authors' layout, their names ours; with `target`, check first that
        it fits. Frozen unless `trainable` (`train.py --init-from` fine-tunes a released one)."""
        path = checkpoint.checkpoint_folder(path, "drafter checkpoint")
        file = path / "config.json"
        raw = checkpoint.read_json(file)
        checkpoint.check_kind(raw, "drafter", path)
        config = DrafterConfig.from_dict(raw, str(file))
        if target is not None:
            check_fits(config, target.config, str(path))
        return checkpoint.load_pretrained(cls, config, path, None, device, dtype,
                                          trainable=trainable)

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write the authors' layout (`config.json` + `model.safetensors`), atomically."""
        checkpoint.save(path, self, None, self.config.to_dict(), dtype)


def cached_block_mask(cache: KVCache, chunk: int, block_positions: torch.Tensor) -> torch.Tensor:
    """(1, keys): a drafted block sees every slot of `cache` up to its own end: the cached context,
    the new context and the whole block (`chunk` of them are written this pass)."""
    keys = torch.arange(cache.keys_to_read(chunk), device=block_positions.device)
    return keys[None, :] <= block_positions[-1]


def check_fits(drafter: DrafterConfig, target: Qwen3Config, source: str = "drafter") -> None:
    """Refuse a drafter trained for another target, naming both values."""
    depth, layers = target.num_hidden_layers, drafter.layers
    pairs = [("hidden_size", layers.hidden_size, "hidden_size", target.hidden_size),
             ("vocab_size", layers.vocab_size, "vocab_size", target.vocab_size),
             ("num_target_layers", drafter.num_target_layers, "num_hidden_layers", depth)]
    for name, ours, target_name, theirs in pairs:
        if ours != theirs:
            raise CheckpointError(f"{source}: drafter {name}={ours} does not fit the target's "
                                  f"{target_name}={theirs}")
    for layer in drafter.target_layer_ids:
        if not 0 <= layer < depth:
            raise CheckpointError(f"{source}: target_layer_ids entry {layer} is outside the "
                                  f"target's {depth} layers")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise CheckpointError(f"{source}: mask_token_id={drafter.mask_token_id} is outside the "
                              f"target's vocab_size={target.vocab_size}")
