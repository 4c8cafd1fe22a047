"""How the loops' passes are compiled: a copy of a pass per runner shape and bucket of slots read.

`torch.compile` with static shapes (`dynamic=False`) builds one graph per input shape; on a GPU,
`mode="reduce-overhead"` records each as a CUDA graph. A pass's shapes are fixed by the runner
(block size, tree budget, buffer length), except the cache slots its attention reads: reading the
whole buffer would be one shape, but every token of a block scores every key read. So the cache
is read up to a bucket (`keys_bucket`), and each bucket gets its own compiled copy, under a position
mask hiding what the slots past each query hold (`FixedReads`).

On a CPU, `FROZEN` compiles with inductor's `freezing`: the weights become the graph's constants,
laid out once for the matmul library (dflash/fast_cpu.py measures what that pays).
"""

from __future__ import annotations

import functools
import types
from typing import Callable

import torch

from dflash.flex_reads import filled_blocks
from dflash.qwen3 import Attend, causal_mask, masked


FROZEN = "inductor-frozen"  # a backend name: inductor, the weights frozen into each graph


@functools.cache
def compiled_copy(function: Callable, shape: tuple, keys: int, backend,
                  mode: str | None) -> Callable:
    """`function` compiled once per process, runner shape and cache slots read: each its own copy
    of the code, as dynamo allows one function 8 graphs, fewer than a benchmark's shapes need."""
    copy = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    if backend != FROZEN:
        return torch.compile(copy, backend=backend, mode=mode, fullgraph=True, dynamic=False)
    return frozen(torch.compile(copy, backend="inductor", mode=mode, fullgraph=True,
                                dynamic=False))


def frozen(compiled: Callable) -> Callable:
    """`compiled`, called with inductor's `freezing` on: dynamo reads it as it traces (the first
    call of a shape), to keep the weights out of the graph's inputs. Frozen graphs read the weights
    as they were then (each graph its own copy, laid out for the matmul library): for inference
    under `torch.no_grad()` only, on weights that no longer change."""
    @functools.wraps(compiled)
    def call(*args, **kwargs):
        with torch._inductor.config.patch(freezing=True):
            return compiled(*args, **kwargs)

    return call


def keys_bucket(needed: int, max_length: int) -> int:
    """The cache slots a compiled pass reads when `needed` hold the sequence: the next power of two
    from 64, at most the buffer. An empty tail costs a 16-token verify 16 times what it costs a
    decode; powers of two read at most twice the keys needed, in log2(max_length / 64) + 1 compiled
    copies."""
    return min(max_length, max(64, 1 << (needed - 1).bit_length()))


class FixedReads:
    """How a fixed-shape pass reads: the first `read_limit` slots, whatever the cache holds (the
    runner sets the limit: a bucket), under a position mask hiding the slots past each query;
    `under` is `masked` (SDPA) or `filled_blocks` (FlexAttention, flex_reads.py). The eager form
    is generate.py's `EagerReads`."""

    def __init__(self, under: Callable[[torch.Tensor], Attend]):
        self.under = under

    def attend(self, positions: torch.Tensor, keys: int, *, causal: bool) -> Attend:
        """A chunk at `positions` (n,): each query sees up to itself (`causal`), or every query
        the whole chunk, up to its last position."""
        last = positions if causal else positions[-1:]  # (n,) or (1,): the last position each sees
        return self.under(causal_mask(last, keys))


FIXED_READS, FLEX_READS = FixedReads(masked), FixedReads(filled_blocks)
