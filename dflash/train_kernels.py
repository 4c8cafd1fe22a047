"""Exact replacements for drafter training's two dense costs, which do not fit at the paper's
settings (tested against the dense ways): the LM-head loss (slots x vocabulary logits) a chunk of
slots at a time (`chunked_lm_head_loss`, with labels or distilling the target's distribution), and
the block attention (K*B x (S + K*B) scores, most masked) skipping what the mask hides
(`AnchoredBlocks`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention


class ChunkedLMHeadLoss(torch.autograd.Function):
    """sum_i w_i * loss_i over the logits hidden_i @ head.T, one chunk of slots at a time: forward
    also takes d loss / d hidden while the chunk's logits exist, and backward only scales it. The
    frozen head gets none. loss_i is the cross-entropy with label_i, or with `distilling`, a pair
    (teacher (N, hidden): the target's last hidden states, d: the distill weight), (1 - d) * that
    + d * KL(target || drafter) (`distillation_terms`)."""

    @staticmethod
    def forward(ctx, hidden, head, targets, chunk_size: int, distilling=None):
        labels, label_weights = targets  # (N,) each: what each slot is scored against, its weight
        wants_grad = ctx.needs_input_grad[0]
        dtype = torch.promote_types(head.dtype, torch.float32)  # the softmax's: float32 at least
        total = torch.zeros((), dtype=dtype, device=hidden.device)
        hits = torch.empty(len(labels), dtype=torch.bool, device=hidden.device)  # (N,)
        grad_hidden = torch.empty_like(hidden) if wants_grad else None  # (N, hidden)
        for start in range(0, len(labels), chunk_size):
            rows = slice(start, start + chunk_size)
            teacher = None if distilling is None else (distilling[0][rows], distilling[1])
            loss, hits[rows], grad = chunk_loss(hidden[rows], head, labels[rows],
                                                label_weights[rows].to(dtype), teacher, wants_grad)
            total += loss
            if wants_grad:
                grad_hidden[rows] = grad.to(hidden.dtype)  # (n, hidden)
        ctx.mark_non_differentiable(hits)
        ctx.save_for_backward(grad_hidden)
        return total, hits

    @staticmethod
    def backward(ctx, grad_total, grad_hits):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_total.to(grad_hidden.dtype), None, None, None, None


def chunk_loss(hidden, head, labels, weights, distilling, wants_grad: bool):
    """One chunk of `ChunkedLMHeadLoss`: (sum_i w_i * loss_i, hits (n,), d/dhidden (n, hidden) or
    None). A function of its own, so that the chunk's (n, vocab) tensors are freed when it returns,
    before the next chunk's are made."""
    teacher, distill_weight = distilling or (None, 0.0)
    hard = 1.0 - distill_weight  # the labels' share of the loss
    logits = F.linear(hidden.to(head.dtype), head).to(weights.dtype)  # (n, vocab): the big one
    label_logits = logits.gather(1, labels[:, None])[:, 0]  # (n,)
    hits = logits.argmax(dim=-1) == labels
    if teacher is not None:  # before `logits` is overwritten below
        target_probabilities, kl_less_logsumexp = distillation_terms(logits, teacher, head)
    row_max = logits.max(dim=-1).values  # (n,)
    exponentials = logits.sub_(row_max[:, None]).exp_()  # (n, vocab), in place: no copy
    sums = exponentials.sum(dim=-1)  # (n,)
    logsumexp = row_max + sums.log()  # (n,)
    losses = hard * (logsumexp - label_logits)  # CE = log sum exp - label logit
    if teacher is not None:
        losses += distill_weight * (kl_less_logsumexp + logsumexp)
    if not wants_grad:
        return (weights * losses).sum(), hits, None
    # d/dlogits of w * loss is w * (softmax - the target distribution: one-hot, the target's, mixed)
    probabilities = exponentials.div_(sums[:, None])  # (n, vocab)
    rows = torch.arange(len(labels), device=logits.device)  # no host sync
    probabilities[rows, labels] -= hard
    if teacher is not None:
        probabilities.sub_(target_probabilities, alpha=distill_weight)
    probabilities.mul_(weights[:, None])
    return (weights * losses).sum(), hits, probabilities.to(head.dtype) @ head


@torch.no_grad()
def distillation_terms(logits: torch.Tensor, teacher: torch.Tensor, head: torch.Tensor):
    """The target's distribution p (n, vocab), from its last hidden states `teacher` (n, hidden),
    and KL(p || softmax(logits)) less logsumexp(logits) (n,): KL = sum_v p_v (log p_v - logits_v)
    + logsumexp. KL(target || drafter) rather than the soft cross-entropy -sum_v p_v log q_v: the
    same gradient (they differ by the target's entropy, a constant), but a loss that is 0 where
    the drafter matches, and that equals the hard cross-entropy where the target is certain."""
    log_p = F.linear(teacher.to(head.dtype), head).to(logits.dtype)  # (n, vocab): the target's
    log_p.sub_(log_p.max(dim=-1, keepdim=True).values)  # in place, as all that follows
    p = log_p.exp()  # (n, vocab): beside `logits`, two big tensors, never three
    sums = p.sum(dim=-1, keepdim=True)  # (n, 1)
    log_p.sub_(sums.log())  # the log-softmax
    p.div_(sums)  # the softmax
    return p, log_p.sub_(logits).mul_(p).sum(dim=-1)


def chunked_lm_head_loss(hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor,
                         label_weights: torch.Tensor, chunk_size: int, *,
                         teacher: torch.Tensor | None = None,
                         distill_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_i w_i * loss_i, top-1 hit of label_i per slot) of `hidden` (N, hidden) through the
    frozen `head` (vocab, hidden); loss_i is the cross-entropy with label_i, or with `teacher`
    (N, hidden), the target's last hidden states, whose logits give the target's distribution of
    the same token, (1 - distill_weight) * that + distill_weight * KL(target || drafter).
    `chunk_size` 0 takes all slots at once with plain autograd: the dense reference."""
    if head.requires_grad:
        raise ValueError("chunked_lm_head_loss computes no gradient for the LM head: it must be "
                         "frozen")
    if chunk_size > 0:
        distilling = None if teacher is None else (teacher, distill_weight)
        return ChunkedLMHeadLoss.apply(hidden, head, (labels, label_weights), chunk_size,
                                       distilling)
    logits = F.linear(hidden.to(head.dtype), head)  # (N, vocab)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least
    losses = F.cross_entropy(logits, labels, reduction="none")  # (N,)
    if teacher is not None:
        target_log_p = F.linear(teacher.to(head.dtype), head).to(logits.dtype).log_softmax(-1)
        kl = F.kl_div(logits.log_softmax(-1), target_log_p, reduction="none", log_target=True)
        losses = (1 - distill_weight) * losses + distill_weight * kl.sum(-1)  # (N,)
    hits = (logits.argmax(dim=-1) == labels).detach()
    return (label_weights.to(logits.dtype) * losses).sum(), hits


@dataclass
class AnchoredBlocks:
    """`train.py`'s attention, keys [context (S) ; blocks (K*B)]: block j sees all of itself, no other block, and
    context c < a_j (at inference x_{a_j}'s feature does not exist yet). `attend` skips every score this hides."""

    anchors: torch.Tensor  # (batch, K), sorted along each row (padding blocks may sit at 0)
    context_length: int  # S
    block_size: int  # B
    blocks_per_chunk: int = 16  # CPU path: blocks per SDPA call (a field so tests cross chunks)
    _flex_mask: object = field(default=None, repr=False)  # built once per step, shared by all layers
    _dense: torch.Tensor | None = field(default=None, repr=False)  # likewise, for the CPU path

    def dense_mask(self) -> torch.Tensor:
        """The pattern as a dense boolean mask (batch, 1, K*B, S + K*B): the reference, and the slow way."""
        (batch, count), block, length = self.anchors.shape, self.block_size, self.context_length
        block_of = torch.arange(count * block, device=self.anchors.device) // block  # (K*B,): each slot's block
        context = torch.arange(length, device=self.anchors.device)  # (S,)
        sees_context = context < self.anchors[:, block_of, None]  # (batch, K*B, S)
        sees_block = (block_of[:, None] == block_of[None, :]).expand(batch, -1, -1)  # (batch, K*B, K*B)
        return torch.cat([sees_context, sees_block], dim=-1)[:, None]  # (batch, 1, K*B, S + K*B)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (batch, heads, K*B, d), k/v (batch, kv_heads, S + K*B, d) -> (batch, heads, K*B, d), as dense."""
        return self.attend_flex(q, k, v) if q.device.type == "cuda" else self.attend_in_chunks(q, k, v)

    def attend_in_chunks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Consecutive blocks a chunk at a time, each one SDPA call against only the keys it can see: the
        anchors are sorted, so a chunk needs the context up to its largest anchor and only its own blocks."""
        count, block, length = self.anchors.shape[1], self.block_size, self.context_length
        if self._dense is None:  # (batch, 1, K*B, S + K*B) booleans: cheap next to the scores they spare
            self._dense = self.dense_mask()
        outputs = []
        for first in range(0, count, self.blocks_per_chunk):
            last = min(first + self.blocks_per_chunk, count)
            rows = slice(first * block, last * block)  # the chunk's queries, and its own keys after the context
            seen = int(self.anchors[:, first:last].max())  # context positions 0..seen-1 are visible to some block
            columns = torch.cat([torch.arange(seen, device=k.device),
                                 length + torch.arange(first * block, last * block, device=k.device)])
            keys, values = k[:, :, columns], v[:, :, columns]  # (batch, kv_heads, seen + chunk, d)
            outputs.append(F.scaled_dot_product_attention(
                q[:, :, rows], keys, values, attn_mask=self._dense[:, :, rows][..., columns], enable_gqa=True))
        return torch.cat(outputs, dim=2)  # (batch, heads, K*B, d)

    def attend_flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """FlexAttention with a block mask: tiles the pattern hides entirely are skipped by the kernel."""
        if self._flex_mask is None:
            self._flex_mask = self.flex_block_mask(q.shape[2], k.shape[2], q.device)
        compiled = compiled_flex_attention(dynamic=q.device.type != "cpu")  # on the CPU: the tests (see there)
        return compiled(q, k, v, block_mask=self._flex_mask, enable_gqa=True)

    def flex_block_mask(self, num_queries: int, num_keys: int, device):
        """FlexAttention's block mask, listed tile by tile from the anchors, not from the dense mask `create_block_mask`
        would evaluate first. A query tile holds rows of blocks `first..last` (the end ones may straddle the tile's
        edges), so it needs the context tiles up to their largest anchor and the key tiles of their slots, all of them:
        the tile's own rows are not enough when the block size does not divide the tile."""
        anchors, block, length, tile = self.anchors.to(device), self.block_size, self.context_length, 128  # Flex's tile
        (batch, count), query_tiles, key_tiles = anchors.shape, -(-num_queries // tile), -(-num_keys // tile)
        first_row = torch.arange(query_tiles, device=device) * tile  # (query tiles,)
        last_row = (first_row + tile).clamp(max=num_queries) - 1
        first_block, last_block = first_row // block, last_row // block  # (query tiles,) each
        blocks = torch.arange(count, device=device)  # (K,)
        touches = (blocks >= first_block[:, None]) & (blocks <= last_block[:, None])  # (query tiles, K)
        largest_anchor = anchors[:, None, :].where(touches, 0).amax(-1)  # (batch, query tiles); padding sits at 0
        key_tile = torch.arange(key_tiles, device=device)  # (key tiles,)
        sees_context = key_tile[None, None, :] * tile < largest_anchor[:, :, None]  # (batch, query tiles, key tiles)
        own = (key_tile[None, :] >= (length + first_block[:, None] * block) // tile) & \
              (key_tile[None, :] <= (length + last_block[:, None] * block + block - 1) // tile)  # (q tiles, k tiles)
        listed = sees_context | own[None]  # (batch, query tiles, key tiles)
        counts = listed.sum(-1, dtype=torch.int32)  # (batch, query tiles)
        order = torch.argsort((~listed).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # listed tiles first

        def visible(batch, head, query, key):
            block_index = query // block
            sees_context = (key < length) & (key < anchors[batch, block_index])
            sees_block = (key >= length) & ((key - length) // block == block_index)
            return sees_context | sees_block

        return BlockMask.from_kv_blocks(counts[:, None], order[:, None], BLOCK_SIZE=(tile, tile), mask_mod=visible,
                                        seq_lengths=(num_queries, num_keys))


@functools.cache
def compiled_flex_attention(dynamic: bool = True):
    """`flex_attention`, compiled once per process: uncompiled it runs a slow reference that scores every key. On a GPU
    one kernel serves every step's shape (`dynamic`); inductor's CPU kernel does not build with dynamic shapes (torch
    2.13), so the tests compile one kernel per shape (`dynamic=False`), forward only: the CPU has no backward."""
    return torch.compile(flex_attention, dynamic=dynamic)
