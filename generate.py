"""Generate text with a Qwen3 target, alone or sped up by a DFlash drafter.

Three loops share everything but their inner step:

- `generate_autoregressive`: one target forward pass per new token.
- `generate_dflash`: the drafter guesses a whole block of tokens in one pass, the
  target checks the block in one pass, and every guess up to the first wrong one is
  kept, plus the target's own token at that point (the "bonus"). A step therefore
  commits between 1 and `block_size` tokens for one target pass.
- `generate_dflash_tree`: the same draft pass, but the drafter's per-slot
  distributions grow a tree of guesses (`dflash/tree.py`); the target checks every
  node in one pass, and the longest path it agrees with is kept.

Reading order: sampling, the result, the `ModelRunner` (the caches and the
fixed-shape forward passes), the loops, and the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from dflash.cli import (OneLineErrors, Prompt, UsageError, add_device_options, add_prompt_options, encode_for_generation, int_list,
                        find_tokenizer, pick_device, pick_dtype, run_cli, stop_token_ids)
from dflash.drafter import Drafter
from dflash.flex_reads import FilledBlocksCache
from dflash.qwen3 import KVCache, Qwen3
from dflash.tree import DraftTree, build_tree, path_slots, verify_inputs, walk

WEIGHTS = Path(__file__).parent / "weights"
OnToken = Callable[[int, bool], None]  # (token id, came from an accepted draft)


# ------------------------------------------------------------------------- sampling


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The index of the largest logit in each row (..., vocab) -> (...), the first one on a tie.

    The same index as `logits.argmax(dim=-1)`; `max(...).indices` is faster on the CPU.
    """
    return logits.max(dim=-1).indices


def sample(logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row of logits (..., vocab) -> (...): argmax at temperature 0, else softmax(logits / T).

    Both loops call this one function, so the speculative loop samples from exactly
    the distribution the plain loop samples from.

    The draw is inverse-CDF sampling: one uniform number u per row, and the first
    token whose running probability sum passes u. A token of probability 0 adds
    nothing to the sum, so it is never the first to pass. It is exact, and one
    cumulative sum costs far less than `torch.multinomial` on the CPU.
    """
    if temperature == 0:
        return argmax(logits)
    # float64, so that the running sum over a vocabulary of 150,000 stays exact to ~1e-12.
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # (..., vocab)
    running = probs.cumsum(dim=-1)  # (..., vocab): running[..., -1] is 1 up to rounding
    u = torch.rand(running.shape[:-1] + (1,), dtype=running.dtype, device=running.device, generator=generator)
    u = u * running[..., -1:]  # (..., 1): uniform over [0, the sum)
    picks = torch.searchsorted(running, u, right=True)  # (..., 1): the first index with running > u
    return picks.squeeze(-1).clamp_(max=probs.shape[-1] - 1)  # (...); the clamp guards a u rounded up to the sum


def keep_only(logits: torch.Tensor, allowed: Sequence[int]) -> torch.Tensor:
    """Logits (..., vocab) with every token outside `allowed` at -inf: token healing's first token."""
    mask = torch.full_like(logits, float("-inf"))
    mask[..., list(allowed)] = 0.0
    return logits + mask


# ---------------------------------------------------------------------- the result


@dataclass
class Generation:
    """What one call produced, and how fast.

    Steps are counted one way for both loops: the prefill yields the first new token
    and is not a step; every target pass after it is one step, and
    `acceptance_lengths[i]` is how many tokens step i accepted (kept drafts + the
    target's own token; always 1 in the plain loop). A loop stops as soon as the output
    is full or has its stop token, so no step runs for nothing; only the last step's
    tokens may be cut short by that limit. `seconds` covers prefill and decoding and
    excludes the time spent in `on_token` (printing), reported as `callback_seconds`.
    """

    new_ids: list[int]
    acceptance_lengths: list[int]
    seconds: float
    callback_seconds: float = 0.0
    first_token_seconds: float = 0.0  # time to the first new token: the prefill (and the first sampling)

    @property
    def new_tokens(self) -> int:
        return len(self.new_ids)

    @property
    def steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance(self) -> float:
        """tau: the mean number of tokens one verification pass accepts (1.0 without a drafter)."""
        return sum(self.acceptance_lengths) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def histogram(self, block_size: int) -> list[int]:
        return acceptance_histogram(self.acceptance_lengths, block_size)


def acceptance_histogram(acceptance_lengths: Sequence[int], block_size: int) -> list[int]:
    """How many steps accepted 1, 2, ..., block_size tokens."""
    return [sum(1 for length in acceptance_lengths if length == accepted) for accepted in range(1, block_size + 1)]


def per_position_acceptance(acceptance_lengths: Sequence[int], block_size: int) -> list[float | None]:
    """For draft slots k = 1..block_size-1: how often slot k was kept, given slot k-1 was.

    A block is [last token, draft 1, ..., draft B-1]; slot 0 is not a guess. A step of
    acceptance length L kept the drafts of slots 1..L-1 and, if L < B, rejected slot
    L; the slots after L were never judged. So slot k was reached in the steps with
    L >= k and kept in those with L > k. None for a slot no step reached.
    """
    rates = []
    for slot in range(1, block_size):
        reached = sum(1 for length in acceptance_lengths if length >= slot)
        kept = sum(1 for length in acceptance_lengths if length > slot)
        rates.append(kept / reached if reached else None)
    return rates


class Output:
    """The committed new tokens, and the clock that times them.

    At most `limit` tokens, and nothing after the first stop token (which is kept).
    The clock runs from `start_clock` to `finish`, minus the time spent in `on_token`
    (printing), and notes when the first token came.
    """

    def __init__(self, limit: int, stop_ids: Sequence[int], on_token: OnToken | None, device: torch.device):
        self.limit, self.stop_ids, self.on_token, self.device = limit, set(stop_ids), on_token, device
        self.ids: list[int] = []
        self.stopped = False
        self.began = self.callback_seconds = self.first_token_seconds = 0.0

    @property
    def done(self) -> bool:
        return self.stopped or len(self.ids) == self.limit

    def start_clock(self) -> None:
        synchronize(self.device)  # earlier queued GPU work is not ours to time
        self.began = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.began - self.callback_seconds

    def commit(self, tokens: list[int], drafted: list[bool]) -> None:
        for token, from_draft in zip(tokens, drafted):
            if self.done:
                return
            self.ids.append(token)
            self.stopped = token in self.stop_ids
            if len(self.ids) == 1:  # tokens arrive as Python ints: the device has already finished them
                self.first_token_seconds = self.elapsed()
            if self.on_token is not None:
                began = time.perf_counter()
                self.on_token(token, from_draft)
                self.callback_seconds += time.perf_counter() - began

    def finish(self, acceptance_lengths: list[int]) -> Generation:
        synchronize(self.device)
        return Generation(self.ids, acceptance_lengths, self.elapsed(), self.callback_seconds,
                          self.first_token_seconds)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- the model runner

# The forward passes after the prefill, as plain functions of the models, a cache and
# tensors. Each has a shape that does not depend on where in the sequence it runs (one
# token, one block, one block of context plus one block, `budget + 1` tree nodes), so
# compiled, each compiles once per process, for every runner and prompt alike.


def decode_pass(target: Qwen3, cache: KVCache, token, position, greedy: bool):
    hidden, _ = target(token, position, cache)  # (1, 1, hidden)
    logits = target.logits(hidden[0])  # (1, vocab)
    return argmax(logits) if greedy else logits  # (1,) or (1, vocab)


def verify_pass(target: Qwen3, cache: KVCache, layer_ids, ids, positions, greedy: bool):
    hidden, features = target(ids, positions, cache, capture_layers=layer_ids)
    logits = target.logits(hidden[0])  # (block, vocab)
    return (argmax(logits) if greedy else logits), features  # features: (1, block, n_layers * hidden)


def verify_tree_pass(target: Qwen3, cache: KVCache, layer_ids, ids, positions, greedy: bool, slots, tree_mask):
    hidden, features = target(ids, positions, cache, capture_layers=layer_ids, slots=slots, chunk_mask=tree_mask)
    logits = target.logits(hidden[0])  # (nodes, vocab)
    return (argmax(logits) if greedy else logits), features  # features: (1, nodes, n_layers * hidden)


def draft_logits(target: Qwen3, drafter: Drafter, cache: KVCache, context_features, context_positions, block_ids,
                 block_positions):
    hidden = drafter(context_features, target.embed_tokens(block_ids), context_positions, block_positions, cache=cache)
    return target.logits(hidden[0, 1:])  # (block - 1, vocab): one distribution per drafted slot


def draft_pass(*args):
    return argmax(draft_logits(*args))  # (block - 1,): the chain drafts greedily


def draft_tree_pass(top_k: int, *args):
    logprobs = torch.log_softmax(draft_logits(*args).float(), dim=-1)  # (block - 1, vocab)
    best = logprobs.topk(top_k, dim=-1)  # the tree's candidates, likeliest first
    return best.values, best.indices  # (block - 1, k) each


PASSES = {"decode": decode_pass, "verify": verify_pass, "draft": draft_pass,
          "verify_tree": verify_tree_pass, "draft_tree": draft_tree_pass}


@functools.cache
def compiled_pass(name: str, shape: tuple, backend, mode: str | None):
    """`PASSES[name]` compiled once per process and runner shape, shared by every runner of that shape.

    Dynamo keeps the graphs of one function together (one per shape, greedy or sampled),
    up to its recompile limit of 8 per function: a benchmark of several block sizes at
    several temperatures goes past it. So each shape compiles its own copy of the
    function (a new code object, the same code), which holds at most two graphs.
    """
    function = PASSES[name]
    copy = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__)
    return torch.compile(copy, backend=backend, mode=mode, fullgraph=True, dynamic=False)


class ModelRunner:
    """The caches, the buffers and the passes of the loops, built once and reused across calls.

    The caches' `length` says what is committed. Each pass writes its chunk right
    after it; `prefill`, `decode` and `verify` then extend the target cache over the
    chunk, and the DFlash loop trims the rejected tail off after verification.
    `verify_tree` commits nothing: `keep_path` moves the accepted path next to the
    committed entries and extends the cache over them.

    Compiled, the caches read their whole buffer under a position mask
    (`KVCache.fixed_shape`), and every output the loop keeps past the next pass is
    copied into a buffer the runner owns: under CUDA graphs a pass may reuse the
    memory of the previous one's outputs. With `flex_attention` the caches are read
    through FlexAttention, visiting only their filled key blocks (`dflash/flex_reads.py`).
    `clock`, when set, is called as `with clock(phase):` around each step's passes
    (`bench.py` times the phases so).
    """

    def __init__(self, target: Qwen3, drafter: Drafter | None = None, *, max_length: int,
                 block_size: int | None = None, tree_budget: int = 0, tree_top_k: int | None = None,
                 compile: bool = False, backend="inductor", mode: str | None = None, flex_attention: bool = False):
        self.target, self.drafter, self.max_length = target, drafter, max_length
        self.block_size = block_size or (drafter.config.block_size if drafter is not None else 1)
        self.tree_budget = tree_budget  # drafted nodes per tree (0: chains only)
        # Candidates per slot: a node's r-th child needs r - 1 siblings first, so more than the budget is never used.
        self.tree_top_k = min(tree_top_k or max(tree_budget, 1), target.config.vocab_size)
        cache_type = FilledBlocksCache if flex_attention else KVCache
        weight = target.embed_tokens.weight
        self.target_cache = cache_type.for_layers(target.config, weight, max_length)
        self.drafter_cache = cache_type.for_layers(drafter.config.layers, weight, max_length) if drafter else None
        self.layer_ids = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        # Buffers the runner owns, reused every step.
        device, width = weight.device, len(self.layer_ids) * target.config.hidden_size
        self.block_offsets = torch.arange(self.block_size, device=device)
        self.token_ids = torch.zeros(1, 1, dtype=torch.long, device=device)  # decode's input
        self.block_ids = torch.zeros(1, self.block_size, dtype=torch.long, device=device)  # [last, drafts]
        self.target_tokens = torch.zeros(self.block_size, dtype=torch.long, device=device)
        self.features = torch.zeros(1, self.block_size, width, dtype=weight.dtype, device=device)  # the last verify's
        # The tree's: the drafter's candidates per slot, then the target's token and features at every node.
        self.draft_logprobs = torch.zeros(self.block_size - 1, self.tree_top_k, device=device)
        self.draft_candidates = torch.zeros(self.block_size - 1, self.tree_top_k, dtype=torch.long, device=device)
        self.node_offsets = torch.arange(tree_budget + 1, device=device)
        self.node_tokens = torch.zeros(tree_budget + 1, dtype=torch.long, device=device)
        self.node_features = torch.zeros(1, tree_budget + 1, width, dtype=weight.dtype, device=device)
        self.compiled, self.clock = compile, None
        self.passes = dict(PASSES)
        if compile:
            for cache in self.caches():
                cache.fixed_shape = True
                for buffer in cache.keys + cache.values:  # they never move: CUDA graphs may write into them
                    torch._dynamo.mark_static_address(buffer)
            shape = (self.block_size, tree_budget, self.tree_top_k, max_length)  # what the passes' shapes follow
            self.passes = {name: compiled_pass(name, shape, backend, mode) for name in PASSES}

    def caches(self) -> list[KVCache]:
        return [cache for cache in (self.target_cache, self.drafter_cache) if cache is not None]

    def timed(self, phase: str):
        return self.clock(phase) if self.clock is not None else contextlib.nullcontext()

    # What the loops call.

    def prefill(self, prompt: torch.Tensor, temperature: float, generator: torch.Generator | None,
                first_token_choices: Sequence[int] | None = None) -> tuple[int, torch.Tensor | None]:
        """Run the prompt (1, n) through the target, eagerly (its shape changes with every prompt).

        Returns the first new token and, for the drafter, the target's features at every
        prompt position (1, n, F), or None without a drafter. With `first_token_choices`
        (token healing), the first token is picked among those only.
        """
        n = prompt.shape[1]
        for cache in self.caches():
            cache.trim(0)
        hidden, features = self.target(prompt, torch.arange(n, device=prompt.device), self.target_cache,
                                       capture_layers=self.layer_ids)
        self.target_cache.extend(n)
        logits = self.target.logits(hidden[0, -1])  # (vocab,)
        if first_token_choices is not None:
            logits = keep_only(logits, first_token_choices)
        return sample(logits, temperature, generator).item(), features

    def decode(self, token: int, temperature: float, generator: torch.Generator | None) -> int:
        """The next token after `token`, which goes right after the committed ones."""
        with self.timed("decode"):
            self.token_ids[0, 0] = token
            position = self.block_offsets[:1] + self.target_cache.length  # (1,)
            picks = self.passes["decode"](self.target, self.target_cache, self.token_ids, position, temperature == 0)
            self.target_cache.extend(1)
            return (picks[0] if temperature == 0 else sample(picks[0], temperature, generator)).item()

    def draft(self, context_features: torch.Tensor, last_token: int, start: int, after_prefill: bool) -> torch.Tensor:
        """Guess the block after `last_token` (at position `start`): (block - 1,) token ids, in the runner's buffer.

        `context_features` (1, ctx, F) are the target's features for the positions the
        drafter has not seen: the prompt's right after the prefill (`after_prefill`: any
        length, so that pass runs eagerly), later the last verify's block, of which only
        `start - drafter_cache.length` positions were accepted. Eager passes keep only
        those; a compiled pass keeps the whole block for a fixed shape, and the block it
        drafts overwrites the rejected tail, so that nothing reads it.
        """
        with self.timed("draft"):
            self.block_ids[0, 1:] = self.run_drafter("draft", context_features, last_token, start, after_prefill)
            return self.block_ids[0, 1:]

    def draft_tree(self, context_features: torch.Tensor, last_token: int, start: int, after_prefill: bool):
        """The drafter's `tree_top_k` likeliest tokens at each slot of the block after `last_token`.

        The same pass as `draft`, over the same context (after `keep_path`, the accepted
        path's features come first, as a chain's accepted block does). Returns
        log-probabilities and token ids, (block - 1, k) each, likeliest first, in the
        runner's buffers: slot d's are the candidates for depth d of the tree.
        """
        with self.timed("draft"):
            logprobs, candidates = self.run_drafter("draft_tree", context_features, last_token, start, after_prefill)
            self.draft_logprobs.copy_(logprobs)
            self.draft_candidates.copy_(candidates)
            return self.draft_logprobs, self.draft_candidates

    def run_drafter(self, name: str, context_features, last_token: int, start: int, after_prefill: bool):
        """Feed the drafter its new context and the block [last_token, MASK, ...]; commit the context it keeps."""
        committed = start - self.drafter_cache.length  # context positions accepted since the last draft
        fixed = self.compiled and not after_prefill
        if not fixed:
            context_features = context_features[:, :committed]
        context_positions = self.drafter_cache.length + torch.arange(context_features.shape[1],
                                                                     device=self.block_ids.device)
        self.block_ids[0, 0] = last_token
        self.block_ids[0, 1:] = self.mask_token_id
        run = self.passes[name] if fixed else PASSES[name]  # the prompt's context: any length, eager
        models = (self.target, self.drafter, self.drafter_cache)
        args = (*models, context_features, context_positions, self.block_ids, self.block_offsets + start)
        drafted = run(self.tree_top_k, *args) if name == "draft_tree" else run(*args)
        self.drafter_cache.extend(committed)  # the context is kept; the block's slots were scratch
        return drafted

    def verify(self, drafts: torch.Tensor, temperature: float, generator: torch.Generator | None):
        """The target's token after each slot of [last token, drafts] (block,), and its features (1, block, F).

        The block sits right after the committed tokens, and the cache is extended over
        all of it: the loop trims the rejected tail once it knows how much was accepted.
        Both results live in the runner's buffers until the next verify.
        """
        with self.timed("verify"):
            self.block_ids[0, 1:] = drafts
            positions = self.block_offsets + self.target_cache.length  # (block,)
            picks, features = self.passes["verify"](self.target, self.target_cache, self.layer_ids, self.block_ids,
                                                    positions, temperature == 0)
            self.target_cache.extend(self.block_size)
            self.target_tokens.copy_(picks if temperature == 0 else sample(picks, temperature, generator))
            self.features.copy_(features)
            return self.target_tokens, self.features

    def verify_tree(self, tree: DraftTree, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
        """The target's token after each node of `tree` (budget + 1,), padding nodes included.

        Node i goes to cache slot start + i at position start + depth(i), and sees the
        committed tokens, its ancestors and itself (`verify_inputs`). Nothing is
        committed yet: `keep_path` does it once the walk has chosen the path.
        """
        with self.timed("verify"):
            tokens, depths, tree_mask = (t.to(self.node_offsets.device) for t in verify_inputs(tree, self.tree_budget))
            start = self.target_cache.length
            picks, features = self.passes["verify_tree"](self.target, self.target_cache, self.layer_ids,
                                                         tokens[None], depths + start, temperature == 0,
                                                         self.node_offsets + start, tree_mask)
            self.node_tokens.copy_(picks if temperature == 0 else sample(picks, temperature, generator))
            self.node_features.copy_(features)
            return self.node_tokens

    def keep_path(self, path: list[int]) -> torch.Tensor:
        """Commit the accepted `path` (node indices, root first) of the last tree verify.

        Its keys and values move from their scattered slots to the slots right after
        the committed ones (`path_slots`, `KVCache.compact`), which are then committed;
        its features move to the front of the features buffer, where the next draft
        reads its context (1, block, F), as after a chain's verify.
        """
        start, device = self.target_cache.length, self.node_offsets.device
        self.target_cache.compact(torch.tensor(path_slots(path, start), device=device), start)
        self.target_cache.extend(len(path))
        self.features[:, :len(path)] = self.node_features[:, torch.tensor(path, device=device)]  # (1, path, F)
        return self.features


# ------------------------------------------------------------------------ the loops


def check_request(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float,
                  runner: ModelRunner | None, drafter: Drafter | None = None, block_size: int = 1,
                  tree_budget: int = 0) -> None:
    """Refuse, with one line, a request the models (and the runner, if given) cannot serve.

    The one check on the way from a public entry point to the passes; it runs before
    any cache is allocated.
    """
    if len(prompt_ids) == 0:
        raise UsageError("the prompt is empty")
    if max_new_tokens <= 0:
        raise UsageError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if temperature < 0:
        raise UsageError(f"temperature must be >= 0, got {temperature}")
    vocab, limit = target.config.vocab_size, target.config.max_position_embeddings
    outside = [token for token in prompt_ids if not 0 <= token < vocab]
    if outside:
        raise UsageError(f"prompt token id {outside[0]} is outside the vocabulary (0..{vocab - 1})")
    if len(prompt_ids) + max_new_tokens > limit:
        raise UsageError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's max_position_embeddings ({limit})")
    if drafter is not None and not 2 <= block_size <= drafter.config.block_size:
        raise UsageError(f"block size must be between 2 and the drafter's {drafter.config.block_size}, "
                         f"got {block_size}")
    if runner is not None and block_size != runner.block_size:
        raise UsageError(f"block size {block_size} differs from the runner's {runner.block_size}")
    if tree_budget and runner is not None and tree_budget != runner.tree_budget:
        raise UsageError(f"tree budget {tree_budget} differs from the runner's {runner.tree_budget}")
    chunk = max(block_size, tree_budget + 1)  # a block, or a tree's nodes
    needed = len(prompt_ids) + max_new_tokens + chunk  # the last chunk may reach past the end
    if runner is not None and needed > runner.max_length:
        raise UsageError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) + block or tree "
                         f"({chunk}) needs {needed} cache slots, the runner has {runner.max_length}")


@torch.no_grad()
def generate_autoregressive(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, *,
                            temperature: float = 0.0, stop_ids: Sequence[int] = (),
                            generator: torch.Generator | None = None, on_token: OnToken | None = None,
                            runner: ModelRunner | None = None,
                            first_token_choices: Sequence[int] | None = None) -> Generation:
    """The baseline: prefill the prompt, then one target pass per new token.

    `first_token_choices` (from token healing) restricts the first new token to a set.
    """
    block_size = runner.block_size if runner is not None else 1
    check_request(target, prompt_ids, max_new_tokens, temperature, runner, block_size=block_size)
    runner = runner or ModelRunner(target, max_length=len(prompt_ids) + max_new_tokens + 1)
    device = target.embed_tokens.weight.device
    output = Output(max_new_tokens, stop_ids, on_token, device)
    output.start_clock()
    prompt = torch.tensor([list(prompt_ids)], device=device)  # (1, n)
    token, _ = runner.prefill(prompt, temperature, generator, first_token_choices)  # the first new token
    output.commit([token], [False])
    while not output.done:
        token = runner.decode(token, temperature, generator)  # the one host sync of the step
        output.commit([token], [False])
    return output.finish([1] * (len(output.ids) - 1))


@torch.no_grad()
def generate_dflash(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    block_size: int | None = None, temperature: float = 0.0, stop_ids: Sequence[int] = (),
                    generator: torch.Generator | None = None, on_token: OnToken | None = None,
                    runner: ModelRunner | None = None,
                    first_token_choices: Sequence[int] | None = None) -> Generation:
    """Speculative decoding with a DFlash drafter: draft a block, verify it, keep the agreeing prefix.

    A draft is kept exactly when it equals the token the target itself samples at
    that slot. That is rejection sampling with a one-hot draft distribution
    (accept with probability p_target(draft)), and the bonus token is the target's own
    sample, so every committed token follows the target's distribution: the output is
    distributed exactly as `generate_autoregressive`'s, and equal to it at temperature 0.
    """
    block_size = block_size or (runner.block_size if runner is not None else drafter.config.block_size)
    check_request(target, prompt_ids, max_new_tokens, temperature, runner, drafter, block_size)
    runner = runner or ModelRunner(target, drafter, block_size=block_size,
                                   max_length=len(prompt_ids) + max_new_tokens + block_size)
    device = target.embed_tokens.weight.device
    output = Output(max_new_tokens, stop_ids, on_token, device)
    output.start_clock()
    prompt = torch.tensor([list(prompt_ids)], device=device)  # (1, n)
    last, context = runner.prefill(prompt, temperature, generator, first_token_choices)  # int, (1, n, F)
    output.commit([last], [False])  # `last` is committed, but not yet in the target's cache
    start, acceptance_lengths = len(prompt_ids), []  # start: the position of `last`
    while not output.done:
        drafts = runner.draft(context, last, start, after_prefill=not acceptance_lengths)  # (block - 1,)
        target_tokens, context = runner.verify(drafts, temperature, generator)  # (block,), (1, block, F)
        both = torch.cat([drafts, target_tokens]).tolist()  # the one host sync of the step
        guessed, wanted = both[:block_size - 1], both[block_size - 1:]
        accepted = next((k for k, (g, w) in enumerate(zip(guessed, wanted)) if g != w), block_size - 1)
        output.commit(wanted[:accepted + 1], [True] * accepted + [False])  # accepted drafts == the target's
        acceptance_lengths.append(accepted + 1)
        last = wanted[accepted]  # the target's own token after them: the bonus, next block's first
        start += accepted + 1
        runner.target_cache.trim(start)  # O(1): keep the block up to the new `last`, forget the rest
    return output.finish(acceptance_lengths)


@torch.no_grad()
def generate_dflash_tree(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                         budget: int, block_size: int | None = None, temperature: float = 0.0,
                         stop_ids: Sequence[int] = (), generator: torch.Generator | None = None,
                         on_token: OnToken | None = None, runner: ModelRunner | None = None,
                         first_token_choices: Sequence[int] | None = None) -> Generation:
    """Speculative decoding with draft trees: draft a block, grow a tree of `budget` guesses, keep the agreeing path.

    One draft pass gives a distribution for every slot of the block; the tree holds
    the `budget` continuations the drafter finds likeliest, and the target checks all
    of them in one pass (`dflash/tree.py`). The walk keeps the path along which every
    draft equals the target's own token, plus the target's token after it, so the
    output is distributed exactly as `generate_autoregressive`'s (the argument is in
    `walk`'s docstring), and equal to it at temperature 0. A step commits between 1
    and `block_size` tokens, as the chain's does, but more of them on average.
    """
    block_size = block_size or (runner.block_size if runner is not None else drafter.config.block_size)
    if budget < 1:
        raise UsageError(f"a tree needs a budget of at least 1 node, got {budget}")
    check_request(target, prompt_ids, max_new_tokens, temperature, runner, drafter, block_size, budget)
    runner = runner or ModelRunner(target, drafter, block_size=block_size, tree_budget=budget,
                                   max_length=len(prompt_ids) + max_new_tokens + max(block_size, budget + 1))
    device = target.embed_tokens.weight.device
    output = Output(max_new_tokens, stop_ids, on_token, device)
    output.start_clock()
    prompt = torch.tensor([list(prompt_ids)], device=device)  # (1, n)
    last, context = runner.prefill(prompt, temperature, generator, first_token_choices)  # int, (1, n, F)
    output.commit([last], [False])  # committed, but not yet in the target's cache: the root of the first tree
    start, acceptance_lengths = len(prompt_ids), []  # start: the position of `last`
    while not output.done:
        logprobs, candidates = runner.draft_tree(context, last, start, after_prefill=not acceptance_lengths)
        tree = build_tree(last, logprobs.tolist(), candidates.tolist(), budget)  # host sync 1: the tree is host-side
        target_tokens = runner.verify_tree(tree, temperature, generator).tolist()  # host sync 2: (budget + 1,)
        path = walk(tree, target_tokens)  # the accepted nodes, root first
        committed = [target_tokens[node] for node in path]  # the accepted drafts (== the target's), then the bonus
        output.commit(committed, [True] * (len(path) - 1) + [False])
        acceptance_lengths.append(len(path))
        context = runner.keep_path(path)  # the path's keys, values and features move next to the committed ones
        last, start = committed[-1], start + len(path)  # the bonus: the next tree's root
    return output.finish(acceptance_lengths)


# ------------------------------------------------------------------ the command line


EXAMPLES = """\
examples:
  python generate.py --prompt "Mia has 14 apples. She buys 9 more. How many apples are there now?"
  python generate.py --prompt "There are 6 trays with 12 muffins in each. The baker sells 20 of the muffins and then gets 5 more. How many muffins are there now?" --compare
  python generate.py --prompt "Leo buys 3 pens that cost 4 dollars each. He pays with 20 dollars. How much change does Leo get?" --compare --tree 32
  python generate.py --prompt "Tom has 7 cards. Ana has twice as many cards as Tom. How many cards does Ana have?" --temperature 0.7
  python generate.py --model weights/Qwen3-8B --draft weights/Qwen3-8B-DFlash-b16 --prompt "Explain KV caches."
  python generate.py --prompt-ids 1,2,3 --model tests/fixtures/qwen3-tiny-sharded \\
      --draft tests/fixtures/dflash-tiny --json

On a terminal, tokens that came from accepted drafts are green, the target's own
tokens are in the default colour. --json prints one object: output_ids (the new
tokens only), text, acceptance_lengths, mean_acceptance, tokens_per_second,
new_tokens, steps (and with --compare baseline_output_ids,
baseline_tokens_per_second, speedup). Bad input exits with status 2.
"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description="Generate with a Qwen3 target, sped up by a DFlash drafter.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", help="the prompt text")
    p.add_argument("--prompt-ids", type=int_list, help="the prompt as token ids, e.g. 1,2,3 (needs no tokenizer)")
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3", help="target checkpoint folder")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash", help="drafter checkpoint folder")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding only")
    p.add_argument("--compare", action="store_true", help="run the baseline, then DFlash, and report the speedup")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, help="tokens per draft block (2..the drafter's; default the drafter's)")
    p.add_argument("--tree", type=int, default=0, metavar="N",
                   help="verify a draft tree of N nodes per step instead of the chain (0, the default: the chain)")
    add_device_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the fixed-shape passes (default: on for CUDA, off for CPU)")
    p.add_argument("--flex-attention", action="store_true",
                   help="attend with FlexAttention, reading only the filled part of the caches (for compiled "
                        "passes on CUDA; exact everywhere, slow uncompiled; not yet measured on a GPU)")
    add_prompt_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    return p


def command_line_prompt(args) -> Prompt:
    if args.prompt_ids is not None:
        return Prompt("--prompt-ids", ids=args.prompt_ids)
    if args.prompt is None:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-ids 1,2,3")
    return Prompt("--prompt", text=args.prompt)


class Printer:
    """Streams committed tokens as text; on a terminal, accepted drafts are green.

    Decoding is incremental: only the tokens since the last printed piece (plus the
    one before, for context such as a leading space) are decoded again, so printing
    costs the same per token however long the output grows. A piece that ends inside
    a multi-byte character waits for the rest. Without a tokenizer it prints the ids.
    """

    GREEN, RESET = "\033[32m", "\033[0m"

    def __init__(self, tokenizer, colour: bool, out=None):
        self.tokenizer, self.colour, self.out = tokenizer, colour, out or sys.stdout
        self.ids: list[int] = []
        self.printed = 0  # ids[:printed] are on the screen
        self.context = 0  # ids[context:printed] are decoded again, as the left context of the new ones

    def __call__(self, token: int, drafted: bool) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            piece = f"{token} "
        else:
            decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            known = decode(self.ids[self.context:self.printed])
            text = decode(self.ids[self.context:])
            if text.endswith("\ufffd"):  # an unfinished multi-byte character: wait for the rest
                return
            piece = text[len(known):]
            self.context, self.printed = self.printed, len(self.ids)
        if self.colour and drafted:
            piece = self.GREEN + piece + self.RESET
        self.out.write(piece)
        self.out.flush()


def summary(name: str, result: Generation, block_size: int | None) -> str:
    line = f"{name}: {result.new_tokens} new tokens in {result.seconds:.2f} s, {result.tokens_per_second:.1f} tokens/s"
    if block_size:
        line += (f", {result.steps} steps, tau {result.mean_acceptance:.2f}, "
                 f"acceptance histogram (1..{block_size}) {result.histogram(block_size)}")
    return line


def run(args) -> int:
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    use_draft = not args.no_draft or args.compare
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype) if use_draft else None
    tokenizer = find_tokenizer(args.model)
    prompt_ids, first_token_choices = encode_for_generation(command_line_prompt(args), tokenizer, args.chat,
                                                            args.thinking, args.token_healing)
    block_size = (args.block_size or drafter.config.block_size) if drafter is not None else None
    if args.tree < 0:
        raise UsageError(f"--tree must be 0 (the chain) or a number of nodes, got {args.tree}")
    compile = device.type == "cuda" if args.compile is None else args.compile
    chunk = max(block_size or 1, args.tree + 1)  # a block, or a tree's nodes
    runner = ModelRunner(target, drafter, max_length=len(prompt_ids) + args.max_new_tokens + chunk,
                         block_size=block_size, tree_budget=args.tree, compile=compile,
                         mode="reduce-overhead" if device.type == "cuda" else None,
                         flex_attention=args.flex_attention)
    options = dict(temperature=args.temperature, stop_ids=stop_token_ids(args.model, tokenizer), runner=runner,
                   first_token_choices=first_token_choices)

    def baseline(on_token=None, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate_autoregressive(target, prompt_ids, max_new_tokens, generator=generator,
                                       on_token=on_token, **options)

    def dflash(on_token=None, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        if args.tree:
            return generate_dflash_tree(target, drafter, prompt_ids, max_new_tokens, budget=args.tree,
                                        generator=generator, on_token=on_token, **options)
        return generate_dflash(target, drafter, prompt_ids, max_new_tokens, generator=generator,
                               on_token=on_token, **options)

    loops = ([baseline] if args.compare or drafter is None else []) + ([dflash] if drafter is not None else [])
    conditions = f"device {device}, {str(dtype).removeprefix('torch.')}, batch 1, compile {'on' if compile else 'off'}"
    # A short run of each loop first, outside the measured time: the first call pays one-time
    # costs (allocations, kernel selection; compiling and recording CUDA graphs when compiled).
    began = time.perf_counter()
    for loop in loops:
        loop(max_new_tokens=min(args.max_new_tokens, 2 * (block_size or 1) + 2))
    conditions += f", warm-up {time.perf_counter() - began:.1f} s"
    colour = sys.stdout.isatty() and not args.json
    dflash_name = f"DFlash tree {args.tree}" if args.tree else "DFlash"
    results = {}
    for loop in loops:
        printer = None if args.json else Printer(tokenizer, colour)
        if printer is not None and args.compare:
            print(f"--- {dflash_name if loop is dflash else 'baseline'}")
        results[loop] = loop(on_token=printer)
        if printer is not None:
            print()
    final = results[loops[-1]]
    speedup = final.tokens_per_second / max(results[baseline].tokens_per_second, 1e-9) if args.compare else None
    if args.json:
        report = {
            "output_ids": final.new_ids,
            "text": tokenizer.decode(final.new_ids, skip_special_tokens=True) if tokenizer is not None else "",
            "acceptance_lengths": final.acceptance_lengths,
            "mean_acceptance": final.mean_acceptance,
            "tokens_per_second": final.tokens_per_second,
            "new_tokens": final.new_tokens,
            "steps": final.steps,
        }
        if args.compare:
            report.update(baseline_output_ids=results[baseline].new_ids, speedup=speedup,
                          baseline_tokens_per_second=results[baseline].tokens_per_second)
        print(json.dumps(report))
        return 0
    print(f"[{conditions}]", file=sys.stderr)
    for loop, result in results.items():
        name = dflash_name if loop is dflash else "baseline"
        print(summary(name, result, block_size if loop is dflash else None), file=sys.stderr)
    if args.compare:
        print(f"speedup: {speedup:.2f}x", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
