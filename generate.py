"""Generate text with a Qwen3 target, alone or sped up by a DFlash drafter.

- `generate_autoregressive`: one target pass per new token (the baseline).
- `generate_dflash`: the drafter guesses a block in one pass, the target checks it in one pass,
  and the guesses up to the first wrong one are kept, plus the target's own token there.
- `generate_dflash_tree`: the draft pass grows a tree of guesses (`dflash/tree.py`); the target
  checks every node in one pass and the longest agreeing path is kept.

Reading order: the passes, the `ModelRunner` that owns the caches and buffers they work on, the loops, the
command line. The record a call returns, `Generation`, is in `dflash/results.py`; a tree's algorithm
(build, ancestor mask, walk) in `dflash/tree.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from dflash.cli import (OneLineErrors, UsageError, add_device_options, checked, int_list, pick_device,
                        pick_dtype, positive_int, run_cli)
from dflash.compiled import compiled_copy, keys_bucket
from dflash.drafter import Drafter, cached_block_mask
from dflash.flex_reads import filled_blocks
from dflash.prompts import Prompt, add_prompt_options, check_no_mask_token, check_request, encode_for_generation
from dflash.qwen3 import KVCache, Qwen3, argmax, causal_mask, masked, tree_mask_over_cache
from dflash.results import Generation, OnToken, synchronize
from dflash.sampling import (Sampling, add_sampling_options, as_sampling, draw, keep_only, sample, sampled_slots,
                             sampling_of, verdicts)
from dflash.tokenizer import Printer, find_tokenizer, stop_token_ids
from dflash.tree import DraftTree, build_tree, path_slots, verify_inputs, walk

WEIGHTS = Path(__file__).parent / "weights"


# ---------------------------------------------------------------- the passes

# The passes after the prefill, as plain functions of the models, a cache and tensors, of shapes that do not
# depend on where in the sequence they run. Each writes its chunk right after the cache's committed length and
# commits nothing. `reads` builds the attention from the position mask: `masked`, or `filled_blocks` to visit
# only a long cache's filled key blocks. Greedy, a pass returns token ids; sampling, the logits.


def decode_pass(target: Qwen3, cache: KVCache, token, position, greedy: bool = True, *, reads=masked):
    """The target's pick after one token (1, 1) at `position` (1,): the plain loop's step."""
    attend = reads(causal_mask(position, cache.keys_to_read(1)))  # the committed tokens and itself
    logits = target.logits(target(token, position, cache, attend=attend)[0][0])  # (1, vocab)
    return argmax(logits) if greedy else logits  # (1,) or (1, vocab)


def verify_pass(target: Qwen3, cache: KVCache, ids, positions, greedy: bool = True, *, reads=masked,
                layer_ids=(), tree_slots=None, tree_mask=None):
    """The target's pick after each token of a block (1, block) at `positions`, or of a draft tree's nodes
    (`tree_mask`: ancestors), and its features there, for the next draft."""
    keys = cache.keys_to_read(ids.shape[1])
    if tree_mask is None:  # a chain: causal over the committed tokens and the block
        mask, slots = causal_mask(positions, keys), positions
    else:  # a tree: node i, written at slot tree_slots[i], sees the committed tokens, its ancestors and itself
        mask, slots = tree_mask_over_cache(tree_slots, tree_mask, keys), tree_slots
    hidden, features = target(ids, positions, cache, capture_layers=layer_ids, attend=reads(mask), slots=slots)
    logits = target.logits(hidden[0])  # (block or nodes, vocab)
    return (argmax(logits) if greedy else logits), features  # features: (1, block or nodes, n_layers * hidden)


def draft_pass(target: Qwen3, drafter: Drafter, cache: KVCache, context_features, block_ids, greedy: bool = True, *,
               reads=masked, context_positions, context_slots, block_positions, tree_top_k: int = 0):
    """The block [last token, MASK, ...] (1, block) after the context not yet in `cache`, in one drafter pass."""
    attend = reads(cached_block_mask(cache, context_features.shape[1] + block_ids.shape[1], block_positions))
    hidden = drafter(context_features, target.embed_tokens(block_ids), context_positions, block_positions,
                     cache=cache, attend=attend, context_slots=context_slots)
    logits = target.logits(hidden[0, 1:])  # (block - 1, vocab): one distribution per drafted slot
    if tree_top_k:  # the tree's candidates, likeliest first: (block - 1, k) log-probabilities and ids
        best = torch.log_softmax(logits.float(), dim=-1).topk(tree_top_k, dim=-1)
        return best.values, best.indices
    return argmax(logits) if greedy else logits  # (block - 1,) or (block - 1, vocab)


PASSES = {"decode": decode_pass, "verify": verify_pass, "draft": draft_pass}


# ---------------------------------------------------------------- the model runner


class ModelRunner:
    """The caches, the buffers and the passes of the loops, built once and reused across calls.

    Each pass writes its chunk right after a cache's committed `length`; the loop commits what it keeps
    (`target_cache.extend`). Compiled, every output the loop keeps past the next pass is copied into a
    buffer the runner owns: under CUDA graphs a pass may reuse the memory of the last one's outputs.
    `clock`, when set, is entered as `with clock(phase):` around each pass.
    """

    def __init__(self, target: Qwen3, drafter: Drafter | None = None, *, max_length: int,
                 block_size: int | None = None, tree_budget: int = 0, tree_top_k: int | None = None,
                 compile: bool = False, backend="inductor", mode: str | None = None, flex_attention: bool = False):
        self.target, self.drafter, self.max_length = target, drafter, max_length
        self.block_size = block = block_size or (drafter.config.block_size if drafter is not None else 1)
        self.tree_budget = tree_budget  # drafted nodes per tree (0: chains only)
        # A node's r-th child needs r - 1 siblings first, so more candidates than the budget are never used.
        self.tree_top_k = min(tree_top_k or max(tree_budget, 1), target.config.vocab_size)
        self.reads = filled_blocks if flex_attention else masked  # see dflash/flex_reads.py
        weight = target.embed_tokens.weight
        self.target_cache = KVCache.for_layers(target.config, weight, max_length)
        # The drafter's has `block` slots more: a compiled draft parks the rejected context there (`draft_inputs`).
        self.drafter_cache = KVCache.for_layers(drafter.config.layers, weight, max_length + block) if drafter else None
        self.layer_ids = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        width, device = len(self.layer_ids) * target.config.hidden_size, weight.device
        ids = functools.partial(torch.zeros, dtype=torch.long, device=device)
        self.block_offsets = torch.arange(block, device=device)  # a block's positions, from 0
        self.token_ids, self.block_ids = ids(1, 1), ids(1, block)  # decode's input; verify's [last, drafts]
        self.target_tokens = ids(block)  # the token the target commits after each slot
        self.features = weight.new_zeros(1, block, width)  # the target's features there, for the next draft
        self.draft_probs: torch.Tensor | None = None  # q of the sampled draft slots, for the verdicts
        nodes = tree_budget + 1  # a tree's buffers, as the chain's: the root and the drafted nodes
        self.node_offsets = torch.arange(nodes, device=device)  # a tree's cache slots, from 0
        self.node_tokens = ids(nodes)  # the token the target commits after each node
        self.node_features = weight.new_zeros(1, nodes, width)  # and its features there
        self.draft_logprobs = torch.zeros(block - 1, self.tree_top_k, device=device)  # the candidates per slot
        self.draft_candidates = ids(block - 1, self.tree_top_k)
        self.compiled, self.clock, self.passes = compile, None, dict(PASSES)
        if compile:
            for cache in self.caches():
                for buffer in cache.keys + cache.values:  # they never move: CUDA graphs may write into them
                    torch._dynamo.mark_static_address(buffer)
            self.shape = (block, tree_budget, self.tree_top_k, max_length)  # what the passes' shapes follow
            self.widest_chunk = 2 * block + tree_budget  # the most slots one pass writes: a draft's context and block
            self.compile_options = (backend, mode)
            self.passes = {name: functools.partial(self.run_compiled, name) for name in PASSES}

    def run_compiled(self, name: str, *args, **options):
        """`name`'s pass, compiled for the slots its cache reads: the bucket (`keys_bucket`) that holds the
        committed slots and the widest chunk. The slot count is a shape, so each bucket has its own copy.
        The cache reads the bucket during this pass only: an eager pass after it reads what it needs."""
        cache = self.drafter_cache if name == "draft" else self.target_cache
        cache.read_limit = keys_bucket(cache.length + self.widest_chunk, cache.max_length)
        cache.fixed_shape = True
        try:
            return compiled_copy(PASSES[name], self.shape, cache.read_limit, *self.compile_options)(*args, **options)
        finally:
            cache.fixed_shape = False

    def caches(self) -> list[KVCache]:
        return [cache for cache in (self.target_cache, self.drafter_cache) if cache is not None]

    def timed(self, phase: str):
        return self.clock(phase) if self.clock is not None else contextlib.nullcontext()

    def prefill(self, prompt_ids: Sequence[int] | torch.Tensor, sampling: Sampling | float, generator: torch.Generator | None,
                first_token_choices: Sequence[int] | None = None) -> tuple[int, torch.Tensor]:
        """The prompt through the target, eagerly (its length changes with every prompt), all of it committed:
        the first new token (one of `first_token_choices` under token healing) and the features (1, n, F)."""
        for cache in self.caches():
            cache.trim(0)
        prompt = torch.as_tensor(prompt_ids, device=self.block_offsets.device).view(1, -1)  # (1, n)
        hidden, features = self.target(prompt, cache=self.target_cache, capture_layers=self.layer_ids)
        self.target_cache.extend(prompt.shape[1])
        logits = self.target.logits(hidden[0, -1])  # (vocab,)
        if first_token_choices is not None:
            logits = keep_only(logits, first_token_choices)
        sampling = as_sampling(sampling)
        first = argmax(logits) if sampling.greedy else sample(logits, sampling, generator)
        return first.item(), features

    def decode(self, token: int, sampling: Sampling | float, generator: torch.Generator | None) -> int:
        """The next token after `token`, which is written right after the committed ones (the loop commits it)."""
        sampling = as_sampling(sampling)
        with self.timed("decode"):
            self.token_ids[0, 0] = token
            position = self.block_offsets[:1] + self.target_cache.length  # (1,)
            picks = self.passes["decode"](self.target, self.target_cache, self.token_ids, position, sampling.greedy,
                                          reads=self.reads)
            return (picks[0] if sampling.greedy else sample(picks[0], sampling, generator)).item()

    # ------------------------------------------------------------------- chains

    def draft(self, context_features: torch.Tensor, last_token: int, start: int) -> torch.Tensor:
        """Guess the block after `last_token` (at position `start`): (block - 1,) ids, in the runner's buffer.
        `context_features` (1, ctx, F) are the target's features where the drafter has not looked yet:
        the prompt's right after the prefill, later the last verify's block."""
        with self.timed("draft"):
            self.draft_probs = None
            self.block_ids[0, 1:] = self.run_drafter(context_features, last_token, start)
            return self.block_ids[0, 1:]

    def draft_sampled(self, context_features: torch.Tensor, last_token: int, start: int, sampling: Sampling,
                      sampled: int, generator: torch.Generator | None) -> torch.Tensor:
        """As `draft`, but the first `sampled` slots are drawn from the drafter's distribution q (kept in
        `draft_probs` for `verify`); the slots after them are its argmax."""
        with self.timed("draft"):
            logits = self.run_drafter(context_features, last_token, start, greedy=False)
            self.draft_probs = sampling.probs(logits[:sampled])  # (sampled, vocab)
            self.block_ids[0, 1:] = torch.cat([draw(self.draft_probs, generator), argmax(logits[sampled:])])
            return self.block_ids[0, 1:]

    def run_drafter(self, context_features: torch.Tensor, last_token: int, start: int, *, greedy: bool = True,
                    tree_top_k: int = 0):
        """Feed the drafter its new context and the block [last_token, MASK, ...]; commit the context it keeps.

        The context positions accepted since the last draft run up to `start`. Eagerly, and for the first draft
        after the prefill (the drafter's cache is still empty, the prompt's length is any), the pass reads only
        them. Compiled, it takes the whole last block, for a fixed shape, and parks the rejected rows' keys and
        values `block` slots further on, where the block's mask hides them and a later write overwrites them.
        """
        cache, offsets = self.drafter_cache, self.block_offsets
        committed = start - cache.length  # context positions accepted since the last draft
        fixed = self.compiled and cache.length > 0
        if not fixed:
            context_features = context_features[:, :committed]
        context_positions = cache.length + torch.arange(context_features.shape[1], device=offsets.device)
        context_slots = (torch.where(context_positions < start, context_positions, context_positions + len(offsets))
                         if fixed else None)  # None: at their positions (eagerly, every row is accepted context)
        self.block_ids[0, 0] = last_token
        self.block_ids[0, 1:] = self.mask_token_id
        run = self.passes["draft"] if fixed else PASSES["draft"]
        drafted = run(self.target, self.drafter, cache, context_features, self.block_ids, greedy, reads=self.reads,
                      context_positions=context_positions, context_slots=context_slots,
                      block_positions=offsets + start, tree_top_k=tree_top_k)
        cache.extend(committed)  # the context is kept; the block's slots were scratch
        return drafted

    def verify(self, drafts: torch.Tensor, sampling: Sampling | float, generator: torch.Generator | None):
        """The token the target commits after each slot of [last token, drafts] (block,), and its features
        (1, block, F). The block is written after the committed tokens; the loop commits what it keeps."""
        sampling = as_sampling(sampling)
        with self.timed("verify"):
            self.block_ids[0, 1:] = drafts
            positions = self.block_offsets + self.target_cache.length  # (block,)
            picks, features = self.passes["verify"](self.target, self.target_cache, self.block_ids, positions,
                                                    sampling.greedy, reads=self.reads, layer_ids=self.layer_ids)
            if not sampling.greedy:
                picks = verdicts(sampling.probs(picks), drafts, self.draft_probs, generator)
            return self.target_tokens.copy_(picks), self.features.copy_(features)

    # -------------------------------------------------------------------- trees

    def draft_tree(self, context_features: torch.Tensor, last_token: int, start: int):
        """As `draft`, the `tree_top_k` likeliest tokens at each slot, likeliest first: (block - 1, k)
        log-probabilities and ids; slot d's are the candidates at depth d of the tree."""
        with self.timed("draft"):
            logprobs, ids = self.run_drafter(context_features, last_token, start, tree_top_k=self.tree_top_k)
            return self.draft_logprobs.copy_(logprobs), self.draft_candidates.copy_(ids)

    def verify_tree(self, tree: DraftTree, sampling: Sampling | float, generator: torch.Generator | None):
        """The target's token after each node of `tree` (budget + 1,), padding nodes included. Node i goes
        to cache slot start + i at position start + depth(i) and sees the committed tokens, its ancestors
        and itself (`verify_inputs`); `keep_path` then commits the chosen path."""
        sampling = as_sampling(sampling)
        with self.timed("verify"):
            tokens, depths, tree_mask = verify_inputs(tree, self.tree_budget, self.node_offsets.device)
            start = self.target_cache.length
            picks, features = self.passes["verify"](self.target, self.target_cache, tokens[None], depths + start,
                                                    sampling.greedy, reads=self.reads, layer_ids=self.layer_ids,
                                                    tree_slots=self.node_offsets + start, tree_mask=tree_mask)
            self.node_features.copy_(features)
            return self.node_tokens.copy_(picks if sampling.greedy else sample(picks, sampling, generator))

    def keep_path(self, path: list[int]) -> torch.Tensor:
        """Commit the accepted `path` (node indices, root first): its keys and values move next to the
        committed ones, its features to the front of `features` (1, block, F) for the next draft."""
        start, nodes = self.target_cache.length, self.node_offsets.new_tensor(path)
        self.target_cache.compact(self.node_offsets.new_tensor(path_slots(path, start)), start)
        self.target_cache.extend(len(path))
        self.features[:, :len(path)] = self.node_features[:, nodes]  # (1, path, F)
        return self.features


# ------------------------------------------------------------------------ the loops


class GenerationBuilder:
    """Builds a loop's `Generation`: at most `limit` tokens, none after a stop token, timed without `on_token`."""

    def __init__(self, limit: int, stop_ids: Sequence[int], on_token: OnToken | None, device: torch.device):
        self.limit, self.stop_ids, self.on_token, self.device = limit, set(stop_ids), on_token, device
        self.result = Generation([], [], 0.0)
        synchronize(device)  # earlier queued GPU work is not ours to time
        self.began = time.perf_counter()

    @property
    def done(self) -> bool:
        ids = self.result.new_ids
        return len(ids) == self.limit or bool(ids) and ids[-1] in self.stop_ids

    def commit(self, tokens: list[int], drafted: int = 0, step: bool = True) -> None:
        """Record a step (or the prefill) that committed `tokens`, of which the first `drafted` were drafts."""
        result = self.result
        if step:
            result.acceptance_lengths.append(len(tokens))  # counted whole, even past the limit
        for i, token in enumerate(tokens):
            if self.done:
                break
            result.new_ids.append(token)
            if self.on_token is not None:
                began = time.perf_counter()
                self.on_token(token, i < drafted)
                result.callback_seconds += time.perf_counter() - began
        result.seconds = time.perf_counter() - self.began - result.callback_seconds  # so far: the ids are on the host
        result.first_token_seconds = result.first_token_seconds or result.seconds

    def finish(self) -> Generation:
        synchronize(self.device)
        self.result.seconds = time.perf_counter() - self.began - self.result.callback_seconds
        return self.result


def ready_runner(target: Qwen3, drafter: Drafter | None, prompt_ids: Sequence[int], max_new_tokens: int, *,
                 runner: ModelRunner | None, block_size: int, tree_budget: int = 0) -> ModelRunner:
    """Check the request (`check_request`); return `runner`, or a new one sized for it."""
    slots = len(prompt_ids) + max_new_tokens + max(block_size, tree_budget + 1)  # the last block or tree may reach past
    check_request(target, drafter, prompt_ids, max_new_tokens, block_size=block_size, tree_budget=tree_budget)
    runner = runner or ModelRunner(target, drafter, block_size=block_size, tree_budget=tree_budget, max_length=slots)
    runner_fits = (block_size, tree_budget or runner.tree_budget) == (runner.block_size, runner.tree_budget)
    if not runner_fits or slots > runner.max_length:
        raise UsageError(f"block size {block_size}, tree budget {tree_budget} and {slots} cache slots do not fit the "
                         f"runner's {runner.block_size}, {runner.tree_budget} and {runner.max_length}")
    return runner


@torch.no_grad()
def generate_autoregressive(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, *, temperature=0.0,
                            sampling: Sampling | None = None, stop_ids: Sequence[int] = (), generator=None,
                            on_token: OnToken | None = None, runner: ModelRunner | None = None,
                            first_token_choices: Sequence[int] | None = None) -> Generation:
    """The baseline: one target pass per new token. `sampling` (default: the plain softmax at `temperature`)
    says how tokens are drawn; `first_token_choices` (token healing) limits the first new token."""
    sampling = sampling or Sampling(temperature)
    runner = ready_runner(target, None, prompt_ids, max_new_tokens, runner=runner,
                          block_size=runner.block_size if runner is not None else 1)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, target.embed_tokens.weight.device)
    token, _ = runner.prefill(prompt_ids, sampling, generator, first_token_choices)
    output.commit([token], step=False)  # committed, but not yet in the target's cache
    while not output.done:
        token_after = runner.decode(token, sampling, generator)  # the one host sync of the step
        runner.target_cache.extend(1)  # commit `token`, now written in the cache
        token = token_after
        output.commit([token])
    return output.finish()


@torch.no_grad()
def generate_dflash(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    block_size: int | None = None, temperature=0.0, sampling: Sampling | None = None,
                    draft_policy: str = "greedy", stop_ids: Sequence[int] = (), generator=None,
                    on_token: OnToken | None = None, runner: ModelRunner | None = None,
                    first_token_choices: Sequence[int] | None = None) -> Generation:
    """Speculative decoding: draft a block, verify it, keep the drafts that equal the token the target commits
    at their slot (`verdicts`) and the target's token after them. The output follows `generate_autoregressive`'s
    law (equals it, greedy). `draft_policy`: drafts are the drafter's argmax (`greedy`) or drawn (`sampled`;
    `mixed:K`: the first K)."""
    sampling = sampling or Sampling(temperature)
    block_size = block_size or (runner.block_size if runner is not None else drafter.config.block_size)
    sampled = sampled_slots(draft_policy, block_size, sampling)  # slots drawn from the drafter (greedy drafts: 0)
    runner = ready_runner(target, drafter, prompt_ids, max_new_tokens, runner=runner, block_size=block_size)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, target.embed_tokens.weight.device)
    last, context = runner.prefill(prompt_ids, sampling, generator, first_token_choices)  # int, (1, n, F)
    output.commit([last], step=False)  # committed, but not yet in the target's cache
    position = len(prompt_ids)  # of `last`, the newest committed token
    while not output.done:
        drafts = (runner.draft_sampled(context, last, position, sampling, sampled, generator) if sampled
                  else runner.draft(context, last, position))  # (block - 1,)
        committed, context = runner.verify(drafts, sampling, generator)  # (block,), (1, block, F)
        both = torch.cat([drafts, committed]).tolist()  # the one host sync of the step
        guessed, wanted = both[:block_size - 1], both[block_size - 1:]
        accepted = next((k for k, (g, w) in enumerate(zip(guessed, wanted)) if g != w), block_size - 1)
        runner.target_cache.extend(accepted + 1)  # commit `last` and the kept drafts; the rest is overwritten later
        output.commit(wanted[:accepted + 1], drafted=accepted)  # the kept drafts, then the target's own token
        last, position = wanted[accepted], position + accepted + 1  # the target's token opens the next block
    return output.finish()


@torch.no_grad()
def generate_dflash_tree(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                         budget: int, block_size: int | None = None, temperature=0.0, sampling: Sampling | None = None,
                         stop_ids: Sequence[int] = (), generator=None, on_token: OnToken | None = None,
                         runner: ModelRunner | None = None, first_token_choices: Sequence[int] | None = None):
    """Speculative decoding with a tree of the `budget` continuations the drafter finds likeliest, all checked
    in one pass (`dflash/tree.py`); the walk keeps the path the target agrees with, plus its token after it.
    Children are chosen, not sampled: sampled children would need a multi-draft rule."""
    sampling = sampling or Sampling(temperature)
    block_size = block_size or (runner.block_size if runner is not None else drafter.config.block_size)
    if budget < 1:
        raise UsageError(f"a tree needs a budget of at least 1 node, got {budget}")
    runner = ready_runner(target, drafter, prompt_ids, max_new_tokens, runner=runner, block_size=block_size,
                          tree_budget=budget)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, target.embed_tokens.weight.device)
    last, context = runner.prefill(prompt_ids, sampling, generator, first_token_choices)  # int, (1, n, F)
    output.commit([last], step=False)
    position = len(prompt_ids)  # of `last`: the root of the next tree
    while not output.done:
        logprobs, candidates = runner.draft_tree(context, last, position)
        tree = build_tree(last, logprobs.tolist(), candidates.tolist(), budget)  # host sync 1: the tree is host-side
        target_tokens = runner.verify_tree(tree, sampling, generator).tolist()  # host sync 2: (budget + 1,)
        path = walk(tree, target_tokens)  # the accepted nodes, root first
        committed = [target_tokens[node] for node in path]  # the accepted drafts (== the target's), then its own
        context = runner.keep_path(path)  # commit: the path's keys, values and features move next to the committed
        output.commit(committed, drafted=len(path) - 1)
        last, position = committed[-1], position + len(path)
    return output.finish()


# ------------------------------------------------------------------ the command line


EXAMPLES = """\
examples:
  python generate.py --prompt "Mia has 14 apples. She buys 9 more. How many apples are there now?"
  python generate.py --prompt "Leo buys 3 pens that cost 4 dollars each. He pays with 20 dollars. How much change does Leo get?" --compare --tree 16
  python generate.py --prompt "Tom has 7 cards. Ana has twice as many cards as Tom. How many cards does Ana have?" --sample-from-config --draft-policy mixed:2
  python generate.py --prompt-ids 1,2,3 --model tests/fixtures/qwen3-tiny-sharded --draft tests/fixtures/dflash-tiny --json

On a terminal, tokens from accepted drafts are green. Bad input exits with status 2.
"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description="Generate with a Qwen3 target, sped up by a DFlash drafter.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    either = p.add_mutually_exclusive_group()
    either.add_argument("--prompt", help="the prompt text")
    either.add_argument("--prompt-ids", type=int_list, help="the prompt as token ids, e.g. 1,2,3 (needs no tokenizer)")
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3", help="target checkpoint folder")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash", help="drafter checkpoint folder")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding only")
    p.add_argument("--compare", action="store_true", help="run the baseline, then DFlash, and report the speedup")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    add_sampling_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=checked(int, "at least 2", lambda x: x >= 2),
                   help="tokens per draft block (2..the drafter's; default the drafter's)")
    p.add_argument("--tree", type=checked(int, "0 (no tree) or more", lambda x: x >= 0), default=0, metavar="N",
                   help="verify a draft tree of N nodes per step")
    add_device_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the fixed-shape passes (default: on for CUDA, off for CPU)")
    p.add_argument("--flex-attention", action="store_true", help="read the caches through FlexAttention, only their "
                   "filled blocks (for compiled passes on CUDA; slow uncompiled; not yet measured on a GPU)")
    add_prompt_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text: output_ids, text, "
                   "acceptance_lengths, mean_acceptance, tokens_per_second, new_tokens, steps (with --compare also "
                   "baseline_output_ids, baseline_tokens_per_second, speedup)")
    return p


def check_options(args) -> Prompt:
    """The prompt the options give; options that contradict each other, or one the run would ignore, are refused
    before any model is loaded."""
    if args.prompt is None and args.prompt_ids is None:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-ids 1,2,3")
    if args.tree and args.draft_policy != "greedy":
        raise UsageError("--tree takes only the greedy draft policy")
    ignored = {"--compare": args.compare, "--tree": args.tree, "--block-size": args.block_size,
               "--draft-policy": args.draft_policy != "greedy"}
    for option, given in ignored.items():
        if args.no_draft and given:
            raise UsageError(f"--no-draft decodes without the drafter, which {option} needs: give one of them")
    return (Prompt("--prompt", text=args.prompt) if args.prompt_ids is None
            else Prompt("--prompt-ids", ids=args.prompt_ids))


def run(args) -> int:
    prompt = check_options(args)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    sampling = sampling_of(args, args.model)
    tokenizer = find_tokenizer(args.model)
    prompt_ids, choices = encode_for_generation(prompt, tokenizer, args.chat, args.thinking, args.token_healing)
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = None if args.no_draft else Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype)
    block_size = (args.block_size or drafter.config.block_size) if drafter is not None else 1
    check_request(target, drafter, prompt_ids, args.max_new_tokens, block_size=block_size, tree_budget=args.tree,
                  where=prompt.where)  # before the runner allocates its caches
    check_no_mask_token(drafter, prompt_ids, prompt.where)
    sampled_slots(args.draft_policy, block_size, sampling)  # a bad policy is refused before any work
    compile = device.type == "cuda" if args.compile is None else args.compile
    runner = ModelRunner(target, drafter, block_size=block_size, tree_budget=args.tree, compile=compile,
                         max_length=len(prompt_ids) + args.max_new_tokens + max(block_size, args.tree + 1),
                         mode="reduce-overhead" if device.type == "cuda" else None, flex_attention=args.flex_attention)
    common = dict(sampling=sampling, stop_ids=stop_token_ids(args.model, tokenizer), runner=runner,
                  first_token_choices=choices)
    loops = {}  # name -> the loop, given max_new_tokens and the rest
    if args.compare or drafter is None:
        loops["baseline"] = functools.partial(generate_autoregressive, target, prompt_ids, **common)
    if drafter is not None and args.tree:
        loops[f"DFlash tree {args.tree}"] = functools.partial(generate_dflash_tree, target, drafter, prompt_ids,
                                                              budget=args.tree, **common)
    elif drafter is not None:
        loops["DFlash"] = functools.partial(generate_dflash, target, drafter, prompt_ids,
                                            draft_policy=args.draft_policy, **common)
    # A run of each loop first, unmeasured, pays one-time costs (allocations, kernel choice; compiling, recording
    # graphs): compiled, to the limit without stopping, so that every `keys_bucket` the measured run reads is compiled.
    warm_tokens = args.max_new_tokens if compile else min(args.max_new_tokens, 2 * block_size + 2)
    began = time.perf_counter()
    for loop in loops.values():
        loop(warm_tokens, generator=torch.Generator(device).manual_seed(args.seed), stop_ids=())
    warm_up, results = time.perf_counter() - began, {}
    for name, loop in loops.items():
        if args.compare and not args.json:
            print(f"--- {name}")
        results[name] = loop(args.max_new_tokens, generator=torch.Generator(device).manual_seed(args.seed),
                             on_token=None if args.json else Printer(tokenizer, sys.stdout.isatty()))
        print("" if args.json else "\n", end="")
    final, slow = list(results.values())[-1], results.get("baseline") if args.compare else None
    if args.json:
        print(json.dumps(final.report(tokenizer.decode(final.new_ids, skip_special_tokens=True) if tokenizer else "",
                                      slow)))
        return 0
    print(f"[device {device}, {str(dtype).removeprefix('torch.')}, batch 1, compile {'on' if compile else 'off'}, "
          f"{sampling}, warm-up {warm_up:.1f} s]", file=sys.stderr)
    for name, result in results.items():
        print(result.summary(name, block_size), file=sys.stderr)
    if slow is not None:
        print(f"speedup: {final.speedup_over(slow):.2f}x", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
