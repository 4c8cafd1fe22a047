"""DFlash2: the DFlash drafter with two additions, in the authors' released layout.

1. Every layer mixes each block slot with the slots just before it, by a small causal
   convolution whose weights the slot itself partly predicts (`GroupedDynamicCausalConv`): once
   before attention and once after it, and the same around the MLP. The layers may attend within
   a sliding window of positions, and the LM head's logits are scaled and soft-capped.
2. A block's guesses are no longer each slot's argmax on its own. The `CandidateSelector` keeps
   each slot's top-k tokens and walks the block from the last committed token, choosing each slot's
   token by its logit plus a low-rank score of (previous token, this token, this slot's state): a
   pair that reads well together wins over two tokens that are each likely but not in a row.

Everything else (KV injection of the target's features, the cache, the target's embedding and LM
head) is the DFlash drafter's (`dflash/drafter.py`), reused by subclassing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dflash import checkpoint
from dflash.checkpoint import POSITIVE_NUMBER, SIZE, CheckpointError, check_fields, is_number
from dflash.drafter import Drafter, DrafterConfig, DrafterLayer, check_fits
from dflash.qwen3 import Attend, KVCache, Qwen3, Rope, argmax, masked
from dflash.sampling import Sampling, draw, tempered_softmax

ARCHITECTURE = "DFlash2DraftModel"  # `architectures` in a released DFlash2 `config.json`

# The DFlash2 fields of `dflash_config` (the reference reads a missing one at the top level).
DFLASH2_FIELD_RULES = {
    "conv_kernel_size": SIZE, "conv_group_size": SIZE, "selector_rank": SIZE,
    "selector_top_k": SIZE, "output_multiplier": POSITIVE_NUMBER,
    "input_embedding_scale": POSITIVE_NUMBER,
    "final_logit_softcapping": ("null, 0 (off) or a finite number above 0",
                                lambda value: value is None or is_number(value) and value >= 0)}
REQUIRED = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DFLASH_FIELDS = ("block_size", "mask_token_id", "target_layer_ids")  # DrafterConfig reads these
LAYER_KINDS = ("full_attention", "sliding_attention")


@dataclass
class DFlash2Config(DrafterConfig):
    """A DFlash drafter's config plus the convolutions', the selector's and the head's fields."""

    conv_kernel_size: int  # taps of each causal convolution: the slot and the ones before it
    conv_group_size: int  # channels sharing one predicted tap weight
    selector_rank: int  # width of the selector's codebooks
    selector_top_k: int  # candidates kept per slot
    output_multiplier: float = 1.0  # the LM head's logits are scaled by it...
    final_logit_softcapping: float | None = None  # ...then squashed into (-cap, cap); None/0: off
    input_embedding_scale: float = 1.0  # the block's embeddings are scaled by it
    sliding_window: int | None = None  # keys further than this from a query are hidden
    is_causal: bool = False  # a slot sees no later slot of its block

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "DFlash2Config":
        """Build from a released `config.json`; a field this code cannot honour stops the load
        in one line naming it."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        if raw.get("architectures") != [ARCHITECTURE]:
            raise CheckpointError(f"{source}: architectures must be [{ARCHITECTURE!r}], got "
                                  f"{json.dumps(raw.get('architectures'))}")
        dflash = raw.get("dflash_config")
        if not isinstance(dflash, dict):
            raise CheckpointError(f"{source}: dflash_config must be an object, got "
                                  f"{json.dumps(dflash)}")
        unknown = sorted(set(dflash) - set(DFLASH2_FIELD_RULES) - set(DFLASH_FIELDS))
        if unknown:
            raise CheckpointError(f"{source}: dflash_config.{unknown[0]} is not supported")
        # As the reference reads them: dflash_config first, else the top level.
        values = {name: dflash.get(name, raw.get(name)) for name in DFLASH2_FIELD_RULES}
        missing = [name for name in REQUIRED if values[name] is None]
        if missing:
            raise CheckpointError(f"{source}: dflash_config.{missing[0]} is missing")
        values = {name: value for name, value in values.items() if value is not None}
        check_fields(values, DFLASH2_FIELD_RULES, source)
        # The rest is a DFlash drafter's config, but for its layer kinds, read right after.
        plain = {name: value for name, value in raw.items()
                 if name not in ("layer_types", "use_sliding_window", "sliding_window")}
        base = DrafterConfig.from_dict(plain, source)
        window, causal = attention_fields(raw, base.layers.num_hidden_layers, source)
        config = cls(**vars(base), **values, sliding_window=window, is_causal=causal)
        check_sizes(config, source)
        return config

    def to_dict(self) -> dict:
        """The released `config.json`: everything in `dflash_config` but the Qwen3 fields."""
        raw = super().to_dict()
        del raw["block_size"]  # the released file keeps it in dflash_config
        depth = self.layers.num_hidden_layers
        kind = "full_attention" if self.sliding_window is None else "sliding_attention"
        extra = {name: getattr(self, name) for name in DFLASH2_FIELD_RULES}
        return {**raw, "architectures": [ARCHITECTURE], "layer_types": [kind] * depth,
                "sliding_window": self.sliding_window,
                "use_sliding_window": self.sliding_window is not None,
                "is_causal": self.is_causal,
                "dflash_config": {**raw["dflash_config"], "block_size": self.block_size, **extra}}


def attention_fields(raw: dict, depth: int, source: str) -> tuple[int | None, bool]:
    """(sliding window or None, causal) from `layer_types`, `sliding_window` and `is_causal`.
    As in the reference, a sliding layer is causal unless `is_causal` says otherwise, and
    `use_sliding_window` changes nothing. One pass serves all layers, so all are of one kind."""
    kinds = raw.get("layer_types") or ["full_attention"] * depth
    if not isinstance(kinds, list) or any(kind not in LAYER_KINDS for kind in kinds):
        raise CheckpointError(f"{source}: layer_types must list 'full_attention' or "
                              f"'sliding_attention' per layer, got {json.dumps(kinds)}")
    if len(set(kinds)) > 1:
        raise CheckpointError(f"{source}: layer_types mixes full and sliding layers, which is "
                              f"not supported")
    if len(kinds) != depth:
        raise CheckpointError(f"{source}: layer_types has {len(kinds)} entries for "
                              f"num_hidden_layers={depth}")
    sliding = kinds[:1] == ["sliding_attention"]
    window, causal = raw.get("sliding_window"), raw.get("is_causal")
    if sliding:
        check_fields({"sliding_window": window}, {"sliding_window": SIZE}, source)
    if causal is not None and not isinstance(causal, bool):
        raise CheckpointError(f"{source}: is_causal must be true, false or null, got "
                              f"{json.dumps(causal)}")
    return (window if sliding else None), (sliding if causal is None else causal)


def check_sizes(config: DFlash2Config, source: str) -> None:
    """Refuse sizes the layers cannot be built with, naming the fields."""
    hidden, vocab = config.layers.hidden_size, config.layers.vocab_size
    if hidden % config.conv_group_size:
        raise CheckpointError(f"{source}: conv_group_size={config.conv_group_size} does not "
                              f"divide hidden_size={hidden}")
    if config.selector_top_k > vocab:
        raise CheckpointError(f"{source}: selector_top_k={config.selector_top_k} is more than "
                              f"vocab_size={vocab}")


# ----------------------------------------------------------- the convolution around each sublayer


def grouped_dynamic_convolve(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor,
                             group_size: int, block_length: int | None = None) -> torch.Tensor:
    """Causal convolution along the block: out[t] = sum_o (base[o] + dynamic[t, o]) * x[t - o],
    slots before the block's first counting as zeros. `base` (taps, hidden) is a weight per
    channel, learnt; `dynamic` (batch, seq, taps, groups) is predicted from slot t itself, one
    weight per group of `group_size` channels, so the mixing adapts to what the slot holds at a
    small cost. x (batch, seq, hidden) -> (batch, seq, hidden). With `block_length`, the
    sequence is blocks of that many slots side by side (training's), each convolved alone."""
    if block_length is not None and block_length < x.shape[1]:
        blocks = x.shape[1] // block_length  # (b, K*L, ...) -> (b*K, L, ...): taps stay in a block
        out = grouped_dynamic_convolve(x.reshape(-1, block_length, x.shape[-1]),
                                       dynamic.reshape(-1, block_length, *dynamic.shape[2:]),
                                       base, group_size)
        return out.view(x.shape[0], blocks * block_length, x.shape[-1])
    batch, seq, hidden = x.shape
    taps, groups = base.shape[0], hidden // group_size
    x = x.view(batch, seq, groups, group_size)  # (b, seq, groups, group_size): channels by group
    # (taps, groups, group_size) + (b, seq, taps, groups, 1) -> (b, seq, taps, groups, group_size)
    kernel = base.view(taps, groups, group_size).to(x.dtype) + dynamic[..., None]
    out = torch.zeros_like(x)
    for offset in range(taps):  # slot t reads slot t - offset: shift down, zeros in front
        earlier = F.pad(x[:, :seq - offset], (0, 0, 0, 0, offset, 0))  # (b, seq, groups, gs)
        out = out + kernel[:, :, offset] * earlier
    return out.view(batch, seq, hidden)  # (b, seq, groups, group_size) -> (b, seq, hidden)


class GroupedDynamicCausalConv(nn.Module):
    """Two convolutions wrapped around one sublayer: `prepare` mixes its input, `finish` its
    output. Both kernels are predicted from the sublayer's input (one projection), so `prepare`
    hands `finish` the second.

    Why: a block is drafted all at once, every slot's guess made beside the others'; attention
    mixes slots only by what the queries happen to pick. These few taps (2 in the released
    drafter) give each slot its neighbours before it directly, in order, the left-to-right
    dependency text has, for about `taps` multiply-adds per channel: cheap next to attention."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.block_length: int | None = None  # set by the drafter: slots per block, in training
        groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))  # before, after
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * groups, bias=False)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (batch, seq, hidden) -> (x convolved, the kernel `finish` needs)."""
        groups = x.shape[-1] // self.group_size
        # (b, seq, 2 * taps * groups) -> (b, seq, 2, taps, groups): before and after
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, groups)
        before = grouped_dynamic_convolve(x, dynamic[..., 0, :, :], self.base_kernel[0],
                                          self.group_size, self.block_length)
        return before, dynamic[..., 1, :, :]  # (b, seq, hidden), (b, seq, taps, groups)

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """The sublayer's output (batch, seq, hidden), convolved with the kernel `prepare` made."""
        return grouped_dynamic_convolve(y, dynamic, self.base_kernel[1], self.group_size,
                                        self.block_length)

    @torch.no_grad()
    def start_as_identity(self) -> None:
        """A new drafter's convolutions, before training: each slot passes itself through (the
        current tap 1, the earlier ones and the predicted part 0), so the layer starts as a
        DFlash layer and learns how much of its neighbours to mix in."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()


class DFlash2Layer(DrafterLayer):
    """A DFlash drafter layer with a convolution around the attention and one around the MLP."""

    def __init__(self, config: DFlash2Config, layer_index: int):
        super().__init__(config.layers, layer_index)
        sizes = config.layers.hidden_size, config.conv_kernel_size, config.conv_group_size
        self.attention_conv = GroupedDynamicCausalConv(*sizes)
        self.mlp_conv = GroupedDynamicCausalConv(*sizes)

    def forward(self, block: torch.Tensor, context: torch.Tensor, rope: Rope, attend: Attend,
                cache: KVCache | None, slots: torch.Tensor | None) -> torch.Tensor:
        normed, kernel = self.attention_conv.prepare(self.input_layernorm(block))
        heads = self.attention(normed, context, rope, attend, cache, slots)
        block = block + self.attention_conv.finish(heads, kernel)
        normed, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(block))
        return block + self.mlp_conv.finish(self.mlp(normed), kernel)

    def attention(self, normed: torch.Tensor, context: torch.Tensor, rope: Rope, attend: Attend,
                  cache: KVCache | None, slots: torch.Tensor | None) -> torch.Tensor:
        """DrafterLayer's attention, apart so that the convolution can wrap it: the block's
        queries read the context's keys and the block's (KV injection). normed (batch, B,
        hidden) -> (batch, B, hidden)."""
        attn, seq = self.self_attn, normed.shape[1]
        block_rope = (rope[0][..., -seq:, :], rope[1][..., -seq:, :])  # the block's: (..., B, hd)
        q = attn.queries(normed, block_rope)  # (batch, heads, B, hd)
        k, v = attn.keys_values(torch.cat([context, normed], dim=1), rope)  # (b, kv_h, ctx + B, hd)
        if cache is not None:
            k, v = cache.write(attn.layer_index, slots, k, v)
        return attn.output(attend(q, k, v))  # (batch, B, hidden)


# ------------------------------------------------------------------------ the candidate selector


class CandidateSelector(nn.Module):
    """Choose a block's tokens among each slot's top-k, slot by slot, each conditioned on the
    token chosen before it. A candidate c at slot s after token p scores
    logit(c) + sum_r predecessor[p, r] * projected_hidden[s, r] * successor[c, r]."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        # Stored without `.weight` in the released files: plain parameters, looked up by index.
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each slot's top-k (logits, tokens), both (batch, slots, k), likeliest first."""
        return torch.topk(logits, self.top_k, dim=-1)

    def scores(self, projected: torch.Tensor, unary: torch.Tensor, candidates: torch.Tensor,
               predecessor: torch.Tensor) -> torch.Tensor:
        """One slot's candidate scores (batch, k): projected (batch, rank), unary and candidates
        (batch, k), predecessor (batch,), the token chosen for the slot before."""
        query = self.predecessor_codebook[predecessor] * projected  # (batch, rank)
        pair = torch.einsum("br,bkr->bk", query, self.successor_codebook[candidates])
        return unary + pair  # (batch, k)

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor,
               temperature: float, generator: torch.Generator | None = None,
               sampled: int | None = None):
        """Walk the slots from `anchor_ids` (batch,), the last committed tokens: hidden (batch,
        slots, hidden), logits (batch, slots, vocab). Above temperature 0 the first `sampled`
        slots (default: all) are drawn, the rest argmax. Returns the tokens (batch, slots), the
        candidates (batch, slots, k) and the probabilities each drawn slot was drawn with (batch,
        sampled, k; float64), or None when none was. All on the device: no host sync."""
        unary, candidates = self.candidates(logits)
        projected = self.hidden_projection(hidden)  # (batch, slots, rank)
        drawn = 0 if temperature <= 0 else hidden.shape[1] if sampled is None else sampled
        predecessor, path, probs = anchor_ids, [], []
        for slot in range(hidden.shape[1]):
            scores = self.scores(projected[:, slot], unary[:, slot], candidates[:, slot],
                                 predecessor)
            if slot < drawn:
                probs.append(tempered_softmax(scores, temperature))  # (batch, k)
                index = draw(probs[-1], generator)
            else:
                index = argmax(scores)  # (batch,)
            predecessor = candidates[:, slot].gather(-1, index[:, None])[:, 0]  # (batch,)
            path.append(predecessor)
        return (torch.stack(path, dim=1), candidates,
                torch.stack(probs, dim=1) if probs else None)


def selector_loss(selector: CandidateSelector, hidden: torch.Tensor, logits: torch.Tensor,
                  predecessors: torch.Tensor, labels: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's training loss at N labelled slots, teacher-forced: the walk reaches slot s
    only when the drafts before it were right, so its predecessor is the true token before
    (`predecessors` (N,); for slot 1, the anchor). The loss is the cross-entropy of the slot's
    scores over its top-k candidates with the true token `labels` (N,); where the head's top-k
    misses it, it replaces the last candidate in the loss only (SpecForge PR #772, speculators
    PR #1006). hidden (N, hidden), logits (N, vocab): the drafter's. Returns the loss (N,) and
    whether the walk would draft the true token from the real candidates (N,): its hits."""
    unary, candidates = selector.candidates(logits)  # (N, k) each
    present = (candidates == labels[:, None]).any(dim=-1)  # (N,)
    gold_logit = logits.gather(-1, labels[:, None])  # (N, 1)
    candidates = torch.where(present[:, None], candidates,
                             torch.cat([candidates[:, :-1], labels[:, None]], dim=-1))
    unary = torch.where(present[:, None], unary, torch.cat([unary[:, :-1], gold_logit], dim=-1))
    gold = (candidates == labels[:, None]).int().argmax(dim=-1)  # (N,): its place among them
    scores = selector.scores(selector.hidden_projection(hidden), unary, candidates, predecessors)
    loss = F.cross_entropy(scores.float(), gold, reduction="none")  # (N,)
    return loss, present & (scores.argmax(dim=-1) == gold)


def over_the_vocabulary(candidates: torch.Tensor, probs: torch.Tensor,
                        vocab_size: int) -> torch.Tensor:
    """A sampled walk's distributions (..., k) over each slot's candidates (..., k), as
    distributions over the whole vocabulary (..., vocab), 0 off the candidates: what rejection
    sampling (`dflash.sampling.verdicts`) takes. The reference's `_rejection_sample` with
    `draft_indices` computes the same q(d) and max(0, p - q) from the (k,) form."""
    full = torch.zeros(*probs.shape[:-1], vocab_size, dtype=probs.dtype, device=probs.device)
    return full.scatter_(-1, candidates, probs)  # top-k tokens are distinct: nothing adds up


# ------------------------------------------------------------------------------- the model


class DFlash2Drafter(Drafter):
    """The DFlash2 draft model: call it as the DFlash one; `propose` turns its output into a
    block of guesses, with what rejection sampling needs to judge them."""

    def __init__(self, config: DFlash2Config):
        # The DFlash drafter's parts with no layers of its own; ours are built right after.
        super().__init__(replace(config, layers=replace(config.layers, num_hidden_layers=0)))
        self.config, c = config, config.layers
        self.layers = nn.ModuleList(DFlash2Layer(config, i) for i in range(c.num_hidden_layers))
        self.candidate_selector = CandidateSelector(c.vocab_size, c.hidden_size,
                                                    config.selector_rank, config.selector_top_k)

    def forward(self, features: torch.Tensor, block_embeddings: torch.Tensor,
                context_positions: torch.Tensor, block_positions: torch.Tensor, *,
                cache: KVCache | None = None, attend: Attend | None = None,
                context_slots: torch.Tensor | None = None,
                reads: Callable[[torch.Tensor], Attend] = masked,
                block_size: int | None = None) -> torch.Tensor:
        """As `Drafter.forward`; with a sliding window or causal layers, or over a fixed-shape
        cache, the default `attend` hides what they must not see, read by `reads` (SDPA, or the
        loop's FlexAttention). A caller's own `attend` would not know of the window: refused.
        `block_size`: the blocks' length when several lie side by side (training), for the
        convolutions, whose taps must not reach into the block before."""
        for layer in self.layers:
            layer.attention_conv.block_length = layer.mlp_conv.block_length = block_size
        windowed = self.config.sliding_window is not None or self.config.is_causal
        if windowed and attend is not None:
            raise ValueError("a DFlash2 drafter with a sliding window or causal layers "
                             "builds its own attention mask; pass attend=None")
        if attend is None and (windowed or cache is not None):  # a cache: read to keys_to_read
            attend = reads(self.visible_keys(context_positions, block_positions, cache))
        return super().forward(features, block_embeddings, context_positions, block_positions,
                               cache=cache, attend=attend, context_slots=context_slots)

    def visible_keys(self, context_positions: torch.Tensor, block_positions: torch.Tensor,
                     cache: KVCache | None) -> torch.Tensor:
        """True where a block query may read a key ((B, keys), or (batch, 1, B, keys) batched):
        up to the block's end, not past the query if causal, within the window if any. Keys are
        told by position: the context's then the block's, or a cache's slots, slot = position."""
        context = context_positions.expand(*block_positions.shape[:-1], -1)  # ([batch,] ctx)
        if cache is None:
            keys = torch.cat([context, block_positions], dim=-1)  # ([batch,] ctx + B)
        else:
            chunk = context.shape[-1] + block_positions.shape[-1]
            keys = torch.arange(cache.keys_to_read(chunk), device=block_positions.device)
        query, key = block_positions[..., :, None], keys[..., None, :]  # ([b,] B, 1), ([b,] 1, k)
        visible = key <= block_positions[..., -1:, None]  # ([batch,] B, keys)
        if self.config.is_causal:
            visible = visible & (key <= query)
        window = self.config.sliding_window
        if window is not None:
            visible = visible & (query - key < window)
            if not self.config.is_causal:  # the reference's window reaches forward too
                visible = visible & (key - query < window)
        return visible if visible.dim() == 2 else visible[:, None]  # heads broadcast

    def embed_block(self, target: Qwen3, block_ids: torch.Tensor) -> torch.Tensor:
        """The block's embeddings (batch, B, hidden): the target's, times input_embedding_scale."""
        scale = self.config.input_embedding_scale
        return F.embedding(block_ids, target.embed_tokens.weight) * scale  # (batch, B, hidden)

    def logits(self, hidden: torch.Tensor, target: Qwen3) -> torch.Tensor:
        """The target's LM head on the drafter's states, scaled by output_multiplier, then
        soft-capped: cap * tanh(logits / cap) keeps them in (-cap, cap)."""
        logits = target.logits(hidden) * self.config.output_multiplier  # (..., vocab)
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def propose(self, hidden: torch.Tensor, anchor_ids: torch.Tensor, target: Qwen3,
                temperature: float, generator: torch.Generator | None = None):
        """A block's guesses from the drafter's states of its slots after the anchor (batch,
        B - 1, hidden): `CandidateSelector.select`'s tokens, candidates and probabilities."""
        logits = self.logits(hidden, target)
        return self.candidate_selector.select(hidden, logits, anchor_ids, temperature, generator)

    def start_training(self) -> "DFlash2Drafter":
        """A new drafter's starting point, after `training.init_weights`: identity convolutions
        (`start_as_identity`); the selector's three factors stay small and random (all zero,
        none of them would ever get a gradient)."""
        for layer in self.layers:
            layer.attention_conv.start_as_identity()
            layer.mlp_conv.start_as_identity()
        return self

    def draft_block(self, runner, features: torch.Tensor, last_token: int, sampling: Sampling,
                    sampled: int, generator: torch.Generator | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The speculative loop's draft step (generate.py's `generate_dflash`): the runner's
        draft pass (`draft_pass` below), then the selector's walk from `last_token`, the first
        `sampled` slots drawn at the sampling's temperature, the rest argmax. Returns the drafts
        (block - 1,) and, for rejection sampling, the drawn slots' distributions over the whole
        vocabulary (sampled, vocab), the reference's `draft_indices` rule; or None. The walk
        is tensors on the device: the step's one host sync stays the loop's."""
        logits, states = runner.draft(features, last_token)  # (B - 1, vocab), (B - 1, hidden)
        anchor = runner.block_ids[:, 0]  # (1,): `last_token`, already on the device
        tokens, candidates, probs = self.candidate_selector.select(
            states[None], logits[None], anchor, sampling.temperature, generator, sampled)
        if probs is None:
            return tokens[0], None
        return tokens[0], over_the_vocabulary(candidates[0, :sampled], probs[0], logits.shape[-1])

    @classmethod
    def from_pretrained(cls, path, target: Qwen3 | None = None, device="cpu",
                        dtype: torch.dtype = torch.float32,
                        trainable: bool = False) -> "DFlash2Drafter":
        """Load a released DFlash2 drafter (its names are ours); with `target`, check it fits."""
        path = checkpoint.checkpoint_folder(path, "drafter checkpoint")
        file = path / "config.json"
        config = DFlash2Config.from_dict(checkpoint.read_json(file), str(file))
        if target is not None:
            check_fits(config, target.config, str(path))
        return checkpoint.load_pretrained(cls, config, path, None, device, dtype,
                                          trainable=trainable)


def draft_pass(target: Qwen3, drafter: DFlash2Drafter, cache: KVCache, features, block_ids, *,
               reads=None, context_positions, context_slots, block_positions):
    """generate.py's draft pass for a DFlash2 drafter, shaped alike (so compiled alike): the
    block [last token, MASK, ...] (1, block) embedded with the drafter's scale, its own mask (the
    window), its scaled, capped head. Returns the logits (block - 1, vocab) and the states
    (block - 1, hidden) of the slots after the anchor: the selector's walk needs both."""
    under = masked if reads is None else reads.under  # the runner's reads: SDPA or FlexAttention
    hidden = drafter(features, drafter.embed_block(target, block_ids), context_positions,
                     block_positions, cache=cache, context_slots=context_slots, reads=under)
    states = hidden[0, 1:]  # (block - 1, hidden)
    return drafter.logits(states, target), states


# A draft tree (dflash/tree.py) ranks each depth's candidates once, whatever the path above them;
# the selector's scores depend on the token before, so its tree needs another builder.
NO_TREES = ("draft trees (--tree) are not supported with a DFlash2 drafter: its selector ranks "
            "a slot's candidates by the token before them, which the tree builder cannot follow")


def load_drafter(path, target: Qwen3 | None = None, device="cpu",
                 dtype: torch.dtype = torch.float32, trainable: bool = False) -> Drafter:
    """A DFlash or a DFlash2 drafter, as its `config.json`'s `architectures` says."""
    path = checkpoint.checkpoint_folder(path, "drafter checkpoint")
    file = path / "config.json"
    raw = checkpoint.read_json(file)
    if isinstance(raw, dict) and raw.get("architectures") == [ARCHITECTURE]:
        return DFlash2Drafter.from_pretrained(path, target, device, dtype, trainable)
    check_plain_dflash(raw, str(file))
    return Drafter.from_pretrained(path, target, device, dtype, trainable)


# Fields the reference honours for a DFlash drafter too, and the values that change nothing.
HEAD_AND_EMBEDDING_FIELDS = {"output_multiplier": (1,), "final_logit_softcapping": (None, 0),
                             "input_embedding_scale": (1,)}


def check_plain_dflash(raw, source: str) -> None:
    """Refuse a DFlash config that scales its logits or embeddings: the reference honours those
    fields for DFlash drafters too, and `Drafter` does not implement them."""
    dflash = raw.get("dflash_config") if isinstance(raw, dict) else None
    if not isinstance(dflash, dict):
        return  # Drafter.from_pretrained says what is wrong
    for name, inert in HEAD_AND_EMBEDDING_FIELDS.items():
        value = dflash.get(name, raw.get(name, inert[0]))  # dflash_config first, as there
        if value not in inert:
            raise CheckpointError(f"{source}: {name}={json.dumps(value)} is not supported for a "
                                  f"DFlash drafter (only for {ARCHITECTURE})")
