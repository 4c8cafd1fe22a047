"""Generate text with a Qwen3 target, alone or sped up by a DFlash drafter.

- `generate_autoregressive`: one target pass per new token (the baseline).
- `generate_dflash`: the drafter guesses a block in one pass, the target checks it in one pass,
  and the guesses up to the first wrong one are kept, plus the target's own token there.
- `generate_dflash_tree`: the draft pass grows a tree of guesses (`dflash/tree.py`); the target
  checks every node in one pass and the longest agreeing path is kept.

Reading order: the passes, the `ModelRunner` that owns the caches and buffers they work on, the
loops, the command line. `Generation`, the record a call returns, is in `dflash/results.py`."""

from __future__ import annotations

import functools
import sys
import time
from typing import Sequence

import torch
from torch.nn.attention.bias import causal_lower_right

from dflash.block_choice import choose_block
from dflash.cli import run_cli
from dflash.errors import UsageError
from dflash.compiled import FIXED_READS, FLEX_READS, compiled_copy, keys_bucket
from dflash.drafter import Drafter
from dflash.generate_options import WEIGHTS, build_parser, print_report, read_request  # noqa: F401
from dflash.prompts import check_no_mask_token, check_request
from dflash.qwen3 import Attend, KVCache, Qwen3, argmax, masked, tree_mask_over_cache
from dflash import dflash2
from dflash.dflash2 import DFlash2Drafter, load_drafter
from dflash.results import Generation, OnToken, synchronize
from dflash.sampling import GREEDY, Sampling, draw, keep_only, sample, sampled_slots, verdicts
from dflash.tokenizer import Printer, stop_token_ids
from dflash.tree import DraftTree, build_tree, path_slots, verify_inputs, walk


# ---------------------------------------------------------------- the passes

# The passes after the prefill: functions of the models, a cache and tensors, shaped alike wherever
# they run. Each writes its chunk after the cache's committed length, commits nothing and returns
# logits (the runner picks tokens). How a pass reads the cache is not its to decide: `reads`, which
# the runner hands it (`ModelRunner.run_pass`), says under which mask it reads its keys.


class EagerReads:
    """How an eager pass reads: the committed slots and its chunk (`KVCache.keys_to_read`), under
    the cheapest mask that says so. No mask and a causal bias keep SDPA's fused kernels open. (A
    fixed-shape pass reads a bucket under a position mask: `dflash.compiled.FixedReads`.)"""

    under = staticmethod(masked)  # under a mask the pass built itself (a tree's)

    @staticmethod
    def attend(positions: torch.Tensor, keys: int, *, causal: bool) -> Attend:
        """A chunk at `positions` (n,), the last n of the `keys` read: each query sees up to itself
        (`causal`), or every query the whole chunk (a drafted block, or a single token)."""
        return masked(causal_lower_right(len(positions), keys) if causal else None)


EAGER_READS = EagerReads()


def decode_pass(target: Qwen3, cache: KVCache, token, position, *, reads=EAGER_READS):
    """The target's logits (1, vocab) after one token (1, 1) at `position` (1,): a plain step."""
    attend = reads.attend(position, cache.keys_to_read(1), causal=False)
    return target.logits(target(token, position, cache, attend=attend)[0][0])


def verify_pass(target: Qwen3, cache: KVCache, ids, positions, layer_ids, *, reads=EAGER_READS):
    """The target's logits after each token of a block (1, block) at `positions` (block,), and its
    features there (1, block, n_layers * hidden), for the next draft."""
    attend = reads.attend(positions, cache.keys_to_read(ids.shape[1]), causal=True)
    hidden, features = target(ids, positions, cache, capture_layers=layer_ids, attend=attend)
    return target.logits(hidden[0]), features  # (block, vocab), (1, block, F)


def verify_tree_pass(target: Qwen3, cache: KVCache, ids, positions, *, slots, tree_mask,
                     layer_ids, reads=EAGER_READS):
    """As `verify_pass`, for a draft tree's nodes (1, nodes): node i, at position `positions[i]`
    in cache slot `slots[i]`, sees the committed tokens, its ancestors and itself (`tree_mask`)."""
    mask = tree_mask_over_cache(slots, tree_mask, cache.keys_to_read(ids.shape[1]))
    hidden, features = target(ids, positions, cache, capture_layers=layer_ids,
                              attend=reads.under(mask), slots=slots)
    return target.logits(hidden[0]), features  # (nodes, vocab), (1, nodes, F)


def draft_pass(target: Qwen3, drafter: Drafter, cache: KVCache, features, block_ids, *,
               reads=EAGER_READS, context_positions, context_slots, block_positions):
    """The drafter's logits (block - 1, vocab) for the block [last token, MASK, ...] (1, block),
    after the context `features` (1, ctx, F) not yet in `cache`, in one pass: the block sees the
    cached context, the new context and the whole block, up to its last position."""
    keys = cache.keys_to_read(features.shape[1] + block_ids.shape[1])
    hidden = drafter(features, target.embed_tokens(block_ids), context_positions, block_positions,
                     cache=cache, attend=reads.attend(block_positions, keys, causal=False),
                     context_slots=context_slots)
    return target.logits(hidden[0, 1:])  # (block - 1, vocab): one distribution per drafted slot


PASSES = {"decode": decode_pass, "verify": verify_pass, "verify_tree": verify_tree_pass,
          "draft": draft_pass, "draft2": dflash2.draft_pass}


# ---------------------------------------------------------------- the model runner


class ModelRunner:
    """The caches, the buffers and the passes of the loops, built once and reused across calls.
    The loop commits what it keeps in one call (`commit`, `commit_path`); the drafter's cache holds
    only committed tokens' context, so it commits what it writes. Compiled, every output kept past
    the next pass is copied to a buffer the runner owns: CUDA graphs may reuse a pass's outputs."""

    def __init__(self, target: Qwen3, drafter: Drafter | None = None, *, max_length: int,
                 block_size: int | None = None, tree_budget: int = 0, tree_top_k: int | None = None,
                 compile: bool = False, backend="inductor", mode: str | None = None,
                 flex_attention: bool = False, fixed_shape: bool = False):
        if tree_budget and isinstance(drafter, DFlash2Drafter):
            raise UsageError(dflash2.NO_TREES)
        self.target, self.drafter, self.max_length = target, drafter, max_length
        self.block_size = block = block_size or default_block_size(drafter)
        self.tree_budget = tree_budget  # drafted nodes per tree (0: chains only)
        # A node's r-th child needs r - 1 siblings first: candidates past the budget are never used
        # (1 grows a tree of single children, the chain: tests/test_tree.py checks the two agree).
        self.tree_top_k = min(tree_top_k or max(tree_budget, 1), target.config.vocab_size)
        weight = target.embed_tokens.weight
        self.target_cache = KVCache.for_layers(target.config, weight, max_length)
        # The drafter's has `block` slots more: a compiled draft parks rejected context there.
        self.drafter_cache = (KVCache.for_layers(drafter.config.layers, weight, max_length + block)
                              if drafter is not None else None)
        self.layer_ids = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        width, device = len(self.layer_ids) * target.config.hidden_size, weight.device
        ids = functools.partial(torch.zeros, dtype=torch.long, device=device)
        self.block_offsets = torch.arange(block, device=device)  # a block's positions, from 0
        self.token_ids, self.block_ids = ids(1, 1), ids(1, block)  # decode's input; [last, drafts]
        self.target_tokens = ids(block)  # the token the target picks after each slot
        self.features = weight.new_zeros(1, block, width)  # the target's features there
        nodes = tree_budget + 1  # a tree's buffers, as the chain's: the root and the drafted nodes
        self.node_offsets = torch.arange(nodes, device=device)  # a tree's cache slots, from 0
        self.node_tokens = ids(nodes)  # the token the target picks after each node
        self.node_features = weight.new_zeros(1, nodes, width)  # and its features there
        self.compiled = compile
        # How the passes after the first draft read (`run_pass`): compiled passes need fixed shapes;
        # `fixed_shape` asks for them eagerly too (tests check both read alike). None: eagerly.
        self.reads = ((FLEX_READS if flex_attention else FIXED_READS) if compile or fixed_shape
                      else None)
        self.widest_chunk = 2 * block + tree_budget  # the most a pass writes: context + block
        if compile:
            for cache in self.caches():
                for buffer in cache.keys + cache.values:  # never moved: CUDA graphs write into them
                    torch._dynamo.mark_static_address(buffer)
            self.shape = (block, tree_budget, max_length)  # what the passes' shapes follow
            self.compile_options = (backend, mode)
        self.built = True

    def __setattr__(self, name: str, value) -> None:
        """A built runner is not changed from outside: what a loop reads from it stays what its
        methods made it (a benchmark wraps it instead: dflash/measure.py)."""
        if getattr(self, "built", False):
            raise AttributeError(f"a built ModelRunner's {name} cannot be set: "
                                 "wrap the runner instead")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a ModelRunner's {name} cannot be deleted")

    def caches(self) -> tuple[KVCache, ...]:
        both = (self.target_cache, self.drafter_cache)
        return both if self.drafter_cache is not None else both[:1]

    def run_pass(self, name: str, cache: KVCache, *args, eager: bool = False, **options):
        """Pass `name` on `cache`; the one place that decides how many slots it reads, and under
        which mask. Eagerly: the committed ones and its chunk (`EagerReads`). Else a fixed shape:
        the bucket (`keys_bucket`) holding the committed slots and the widest chunk, under position
        masks (`FixedReads`); the slot count is a shape, so compiled, each bucket has its own copy.
        The cache reads the bucket for this pass only. `eager`: the first draft, whose context is
        the whole prompt (any length)."""
        if eager or self.reads is None:
            return PASSES[name](*args, **options)
        cache.read_limit = keys_bucket(cache.length + self.widest_chunk, cache.max_length)
        try:
            run = (compiled_copy(PASSES[name], self.shape, cache.read_limit, *self.compile_options)
                   if self.compiled else PASSES[name])
            return run(*args, reads=self.reads, **options)
        finally:
            cache.read_limit = None

    def prefill(self, prompt_ids: Sequence[int] | torch.Tensor, sampling: Sampling,
                generator: torch.Generator | None,
                first_token_choices: Sequence[int] | None = None) -> tuple[int, torch.Tensor]:
        """The prompt through the target, eagerly (its length varies), all of it committed: the
        first new token (one of `first_token_choices`, token healing) and the features (1, n, F)."""
        for cache in self.caches():
            cache.trim(0)
        prompt = torch.as_tensor(prompt_ids, device=self.block_offsets.device).view(1, -1)  # (1, n)
        hidden, features = self.target(prompt, cache=self.target_cache,
                                       capture_layers=self.layer_ids)
        self.target_cache.commit(prompt.shape[1])
        logits = self.target.logits(hidden[0, -1])  # (vocab,)
        if first_token_choices is not None:
            logits = keep_only(logits, first_token_choices)
        return sample(logits, sampling, generator).item(), features

    def decode(self, token: int, sampling: Sampling, generator: torch.Generator | None) -> int:
        """The next token after `token`, which is written right after the committed ones."""
        self.token_ids[0, 0], cache = token, self.target_cache
        position = self.block_offsets[:1] + cache.length  # (1,)
        logits = self.run_pass("decode", cache, self.target, cache, self.token_ids, position)
        return sample(logits[0], sampling, generator).item()

    def commit(self, kept: int) -> torch.Tensor:
        """Commit the verified block's first `kept` slots (last token, accepted drafts) to the
        target's cache. Their features (1, kept, F) are the next draft's context (`draft`)."""
        self.target_cache.commit(kept)
        return self.features[:, :kept]

    # ------------------------------------------------------------------- chains

    def draft_sampled(self, features: torch.Tensor, last_token: int, sampling: Sampling,
                      sampled: int, generator: torch.Generator | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts (block - 1,), the first `sampled` drawn from the drafter's distribution q, the
        rest its argmax; and q (sampled, vocab), for the verdicts."""
        logits = self.draft(features, last_token)  # (block - 1, vocab)
        draft_probs = sampling.probs(logits[:sampled])  # (sampled, vocab)
        return torch.cat([draw(draft_probs, generator), argmax(logits[sampled:])]), draft_probs

    def draft(self, features: torch.Tensor, last_token: int, *, commit: bool = True
              ) -> torch.Tensor:
        """The drafter's logits (block - 1, vocab) for [last_token, MASK, ...], `last_token` the
        newest committed. `features` (1, ctx, F) are the target's where the drafter has not looked
        yet (the prompt's, later the kept ones), committed to the drafter's cache. The block starts
        at the target's committed length, the context rows just before it: eagerly (and first after
        the prefill, any prompt length) the pass reads those rows; compiled, the whole features
        buffer (one shape). Not `commit`: the context stays scratch (a calibration's repeats)."""
        cache, offsets, rows = self.drafter_cache, self.block_offsets, features.shape[1]
        start = self.target_cache.length  # of `last_token`: the block's first position
        fixed = self.reads is not None and cache.length > 0  # an empty cache: the first draft
        context_slots = None  # eagerly, every row is context, written at its position
        if fixed:
            features = self.features  # (1, block, F): `features` was its first `rows` rows
        context_positions = start - rows + torch.arange(features.shape[1], device=offsets.device)
        if fixed:  # parked: the rows past the context would land on the block's slots, so
            # they go `block` slots on (the cache has `block` more), past what the block mask shows
            context_slots = context_positions + torch.where(offsets < rows, 0, len(offsets))
        self.block_ids[0, 0] = last_token
        self.block_ids[0, 1:] = self.mask_token_id
        name = "draft2" if isinstance(self.drafter, DFlash2Drafter) else "draft"  # logits, states
        logits = self.run_pass(name, cache, self.target, self.drafter, cache, features,
                               self.block_ids, context_positions=context_positions,
                               context_slots=context_slots, block_positions=offsets + start,
                               eager=not fixed)
        if commit:
            cache.commit(rows)  # the context is kept; the block's slots were scratch
        return logits

    def verify(self, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The token the target picks after each slot of [last token, drafts] (n,), its argmax,
        and its features (1, n, F), n the block or fewer; written after the committed tokens."""
        n = len(drafts) + 1
        self.block_ids[0, 1:n] = drafts
        positions = self.block_offsets[:n] + self.target_cache.length  # (n,)
        cache = self.target_cache
        logits, features = self.run_pass("verify", cache, self.target, cache,
                                         self.block_ids[:, :n], positions, self.layer_ids)
        return self.target_tokens[:n].copy_(argmax(logits)), self.features[:, :n].copy_(features)

    def verify_sampled(self, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                       sampling: Sampling, generator: torch.Generator | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `verify`, the target's token after each slot drawn by the rejection rule (`verdicts`):
        a draft is kept where it equals it; the committed tokens follow the target's law."""
        self.block_ids[0, 1:] = drafts
        positions = self.block_offsets + self.target_cache.length  # (block,)
        cache = self.target_cache
        logits, features = self.run_pass("verify", cache, self.target, cache, self.block_ids,
                                         positions, self.layer_ids)
        target_tokens = verdicts(sampling.probs(logits), drafts, draft_probs, generator)
        return self.target_tokens.copy_(target_tokens), self.features.copy_(features)

    # -------------------------------------------------------------------- trees

    def draft_tree(self, features: torch.Tensor,
                   last_token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's `tree_top_k` likeliest tokens at each slot, likeliest first: (block - 1, k)
        log-probabilities and ids; slot d's are the candidates at depth d of the tree."""
        logits = self.draft(features, last_token)  # (block - 1, vocab)
        return torch.log_softmax(logits.float(), dim=-1).topk(self.tree_top_k, dim=-1)

    def verify_tree(self, tree: DraftTree, sampling: Sampling,
                    generator: torch.Generator | None) -> torch.Tensor:
        """The target's token after each node of `tree` (budget + 1,), padding nodes included.
        Node i goes to cache slot start + i at position start + depth(i) and sees the committed
        tokens, its ancestors and itself (`verify_inputs`); `commit_path` then keeps the path."""
        tokens, depths, tree_mask = verify_inputs(tree, self.tree_budget, self.node_offsets.device)
        start, cache = self.target_cache.length, self.target_cache
        logits, features = self.run_pass("verify_tree", cache, self.target, cache, tokens[None],
                                         depths + start, slots=self.node_offsets + start,
                                         tree_mask=tree_mask, layer_ids=self.layer_ids)
        self.node_features.copy_(features)
        return self.node_tokens.copy_(sample(logits, sampling, generator))

    def commit_path(self, path: list[int]) -> torch.Tensor:
        """Commit the accepted `path` (node indices, root first): its keys and values move next to
        the committed ones. Its features (1, path, F) are the next draft's context."""
        start, nodes = self.target_cache.length, self.node_offsets.new_tensor(path)
        self.target_cache.compact(self.node_offsets.new_tensor(path_slots(path, start)), start)
        self.target_cache.commit(len(path))
        self.features[:, :len(path)] = self.node_features[:, nodes]  # (1, path, F)
        return self.features[:, :len(path)]


def default_block_size(drafter: Drafter | None) -> int:
    """The block a loop drafts unless told: the drafter's own (1 for the plain loop)."""
    return drafter.config.block_size if drafter is not None else 1


def cache_slots(prompt_length: int, max_new_tokens: int, block_size: int,
                tree_budget: int = 0) -> int:
    """The cache slots a request needs: prompt, output, and the last block or tree (may overrun)."""
    return prompt_length + max_new_tokens + max(block_size, tree_budget + 1)


# ------------------------------------------------------------------------ the loops


class GenerationBuilder:
    """Builds a loop's `Generation`: up to `limit` tokens, none past a stop, `on_token` untimed."""

    def __init__(self, limit: int, stop_ids: Sequence[int], on_token: OnToken | None,
                 device: torch.device):
        self.limit, self.stop_ids, self.on_token = limit, set(stop_ids), on_token
        self.device, self.result = device, Generation([], [], 0.0)
        self.done = limit == 0  # the limit is reached, or a stop token committed
        synchronize(device)  # earlier queued GPU work is not ours to time
        self.began = time.perf_counter()

    def commit(self, tokens: list[int], drafted: int = 0, step: bool = True) -> None:
        """Record a step (or the prefill) that committed `tokens`, the first `drafted` drafts."""
        result = self.result
        if step:
            result.acceptance_lengths.append(len(tokens))  # counted whole, even past the limit
        for i, token in enumerate(tokens):
            if self.done:
                break
            result.new_ids.append(token)
            self.done = len(result.new_ids) == self.limit or token in self.stop_ids
            if self.on_token is not None:
                began = time.perf_counter()
                self.on_token(token, i < drafted)
                result.callback_seconds += time.perf_counter() - began
        if self.done and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the clock stops when the GPU's work is done
        result.seconds = time.perf_counter() - self.began - result.callback_seconds
        result.first_token_seconds = result.first_token_seconds or result.seconds


def ready_runner(target: Qwen3, drafter: Drafter | None, prompt_ids: Sequence[int],
                 max_new_tokens: int, *, runner: ModelRunner | None, block_size: int | None,
                 tree_budget: int = 0) -> ModelRunner:
    """A loop call's door. Given a runner, the request must fit it: the model's cheap checks and
    the runner's sizes (its caches exist: no memory to probe). Else the whole request is checked
    (`check_request`, the memory probed once) and a runner is built for it."""
    if runner is None:
        block_size = block_size or default_block_size(drafter)
        check_request(target, drafter, prompt_ids, max_new_tokens, block_size=block_size,
                      tree_budget=tree_budget)
        slots = cache_slots(len(prompt_ids), max_new_tokens, block_size, tree_budget)
        return ModelRunner(target, drafter, block_size=block_size, tree_budget=tree_budget,
                           max_length=slots)
    target.check_request(prompt_ids, max_new_tokens)
    block_size = block_size or runner.block_size
    slots = cache_slots(len(prompt_ids), max_new_tokens, block_size, tree_budget)
    if (block_size, tree_budget or runner.tree_budget) != (runner.block_size, runner.tree_budget) \
            or slots > runner.max_length:
        raise UsageError(f"block size {block_size}, tree budget {tree_budget} and {slots} cache "
                         f"slots do not fit the runner's {runner.block_size}, {runner.tree_budget} "
                         f"and {runner.max_length}")
    return runner


def prefilled(runner: ModelRunner, prompt_ids: Sequence[int], output: GenerationBuilder,
              sampling: Sampling, generator: torch.Generator | None,
              first_token_choices: Sequence[int] | None) -> tuple[int, torch.Tensor]:
    """Every loop's start: the prompt through the target (`ModelRunner.prefill`), its first new
    token committed to `output` (not yet to the target's cache); that token and the features."""
    first, features = runner.prefill(prompt_ids, sampling, generator, first_token_choices)
    output.commit([first], step=False)
    return first, features


@torch.no_grad()
def generate_autoregressive(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, *,
                            sampling: Sampling = GREEDY, stop_ids: Sequence[int] = (),
                            generator=None, on_token: OnToken | None = None,
                            runner: ModelRunner | None = None,
                            first_token_choices: Sequence[int] | None = None) -> Generation:
    """The baseline: one target pass per new token, drawn by `sampling` (default: greedy);
    `first_token_choices` (token healing) limit the first."""
    runner = ready_runner(target, None, prompt_ids, max_new_tokens, runner=runner, block_size=None)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, runner.block_offsets.device)
    token, _ = prefilled(runner, prompt_ids, output, sampling, generator, first_token_choices)
    while not output.done:
        token_after = runner.decode(token, sampling, generator)  # the one host sync of the step
        runner.commit(1)  # `token`, now written in the cache
        token = token_after
        output.commit([token])
    return output.result


@torch.no_grad()
def generate_dflash(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int],
                    max_new_tokens: int, *, sampling: Sampling = GREEDY,
                    draft_policy: str = "greedy", block_size: int | None = None,
                    stop_ids: Sequence[int] = (), generator=None, on_token: OnToken | None = None,
                    runner: ModelRunner | None = None,
                    first_token_choices: Sequence[int] | None = None) -> Generation:
    """Speculative decoding: draft a block, verify it, keep the drafts that match the target's pick
    at their slot, then its own token after them: `generate_autoregressive`'s law (greedy: its
    output). `draft_policy`: drafts are argmax (`greedy`), drawn (`sampled`; `mixed:K`: first K)."""
    runner = ready_runner(target, drafter, prompt_ids, max_new_tokens, runner=runner,
                          block_size=block_size)
    # drafts drawn from the drafter, at the block's first `sampled` slots: none for greedy drafts
    sampled = 0 if draft_policy == "greedy" else sampled_slots(draft_policy, runner.block_size,
                                                                sampling)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, runner.block_offsets.device)
    last, features = prefilled(runner, prompt_ids, output, sampling, generator, first_token_choices)
    while not output.done:
        if isinstance(drafter, DFlash2Drafter):  # the selector walks the block: dflash/dflash2.py
            drafts, draft_probs = drafter.draft_block(runner, features, last, sampling, sampled,
                                                      generator)
        elif sampled:  # (block - 1,) drafts, some drawn from the drafter's q (sampled, vocab)
            drafts, draft_probs = runner.draft_sampled(features, last, sampling, sampled, generator)
        else:  # the drafter's likeliest
            drafts, draft_probs = argmax(runner.draft(features, last)), None
        # (block,) tokens the target picks, (1, block, F) features
        target_tokens, features = (runner.verify_sampled(drafts, draft_probs, sampling, generator)
                                   if sampling.temperature else runner.verify(drafts))
        both = torch.cat([drafts, target_tokens]).tolist()  # the one host sync of the step
        drafts, target_tokens = both[:len(drafts)], both[len(drafts):]
        accepted = 0  # drafts kept: those before the first the target disagrees with
        while accepted < len(drafts) and drafts[accepted] == target_tokens[accepted]:
            accepted += 1
        features = runner.commit(accepted + 1)  # `last` and the kept drafts; their features
        output.commit(target_tokens[:accepted + 1], drafted=accepted)  # drafts, then the target's
        last = target_tokens[accepted]  # the target's own token opens the next block
    return output.result


@torch.no_grad()
def generate_dflash_tree(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int],
                         max_new_tokens: int, *, budget: int, sampling: Sampling = GREEDY,
                         block_size: int | None = None, stop_ids: Sequence[int] = (),
                         generator=None, on_token: OnToken | None = None,
                         runner: ModelRunner | None = None,
                         first_token_choices: Sequence[int] | None = None):
    """Speculative decoding with a tree of the `budget` continuations the drafter finds likeliest,
    all checked in one pass (`dflash/tree.py`); the walk keeps the path the target agrees with,
    plus its token after it. Children are chosen, not sampled (that needs a multi-draft rule)."""
    if budget < 1:
        raise UsageError(f"a tree needs a budget of at least 1 node, got {budget}")
    runner = ready_runner(target, drafter, prompt_ids, max_new_tokens, runner=runner,
                          block_size=block_size, tree_budget=budget)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, runner.block_offsets.device)
    last, features = prefilled(runner, prompt_ids, output, sampling, generator, first_token_choices)
    while not output.done:
        logprobs, candidates = runner.draft_tree(features, last)
        tree = build_tree(last, logprobs.tolist(), candidates.tolist(), budget)  # host sync 1
        target_tokens = runner.verify_tree(tree, sampling, generator).tolist()  # 2: (budget + 1,)
        path = walk(tree, target_tokens)  # the accepted nodes, root first
        committed = [target_tokens[node] for node in path]  # the accepted drafts, then the target's
        features = runner.commit_path(path)  # the path's keys and values next to the committed
        output.commit(committed, drafted=len(path) - 1)
        last = committed[-1]
    return output.result


# ------------------------------------------------------------------ the command line


def generate_from_args(args) -> int:
    """The command: the request read and checked before any load (`read_request`), the models
    loaded, the request checked against them once, the loops warmed up, run and reported."""
    request = read_request(args)
    device, prompt_ids, tokenizer = request.device, request.prompt_ids, request.tokenizer
    target = Qwen3.from_pretrained(args.model, device=device, dtype=request.dtype)
    drafter = None if args.no_draft else load_drafter(
        args.draft, target=target, device=device, dtype=request.dtype)
    stops = stop_token_ids(args.model, tokenizer)
    block_size = args.block_size or default_block_size(drafter)
    if block_size == "auto":  # from this machine's pass costs and the drafter's acceptance
        steps = functools.partial(generate_dflash, target, drafter, prompt_ids, 64, stop_ids=stops)
        block_size = choose_block(ModelRunner, target, drafter, args.draft,
                                  compile=request.compile, first_steps=steps)
    where = request.prompt.where
    check_request(target, drafter, prompt_ids, args.max_new_tokens, block_size=block_size,
                  tree_budget=args.tree, where=where)  # before the runner allocates caches
    check_no_mask_token(drafter, prompt_ids, where)
    sampled_slots(args.draft_policy, block_size, request.sampling)  # a bad policy, before any work
    slots = cache_slots(len(prompt_ids), args.max_new_tokens, block_size, args.tree)
    runner = ModelRunner(target, drafter, block_size=block_size, tree_budget=args.tree,
                         compile=request.compile, max_length=slots,
                         flex_attention=args.flex_attention,
                         mode="reduce-overhead" if device.type == "cuda" else None)
    common = dict(sampling=request.sampling, stop_ids=stops, runner=runner,
                  first_token_choices=request.first_token_choices)
    loops = {}  # name -> the loop, given max_new_tokens and the rest
    if args.compare or drafter is None:
        loops["baseline"] = functools.partial(generate_autoregressive, target, prompt_ids, **common)
    if drafter is not None and args.tree:
        loops[f"DFlash tree {args.tree}"] = functools.partial(
            generate_dflash_tree, target, drafter, prompt_ids, budget=args.tree, **common)
    elif drafter is not None:
        loops["DFlash"] = functools.partial(generate_dflash, target, drafter, prompt_ids,
                                            draft_policy=args.draft_policy, **common)
    # An unmeasured run of each loop pays one-time costs (allocations, kernels, compiling, graphs);
    # compiled, to the limit without stopping: every `keys_bucket` the measured run reads compiles.
    warm_tokens = (args.max_new_tokens if request.compile
                   else min(args.max_new_tokens, 2 * block_size + 2))
    began = time.perf_counter()
    for loop in loops.values():
        loop(warm_tokens, generator=torch.Generator(device).manual_seed(args.seed), stop_ids=())
    warm_up, results = time.perf_counter() - began, {}
    for name, loop in loops.items():
        if args.compare and not args.json:
            print(f"--- {name}")
        printer = None if args.json else Printer(tokenizer, sys.stdout.isatty())
        results[name] = loop(args.max_new_tokens, on_token=printer,
                             generator=torch.Generator(device).manual_seed(args.seed))
        print("" if args.json else "\n", end="")
    print_report(args, request, results, block_size, warm_up)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), generate_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
