"""What the graders share: the demo pair (loaded once, and only when a grader first needs it), the plain
loop's answers to compare a plugged-in piece against, and the tools that enforce a lab's rules.

The graders never hold an answer: they compare with the project's own code, with a simulation, or
with a property the answer must have, and they switch off the calls a lab forbids while the
student's function runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import Callable, Sequence
from unittest import mock

LABS = Path(__file__).resolve().parent
ROOT = LABS.parents[1]  # the repository: dflash/, generate.py, weights/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the labs run from the repository root and from tutorials/ alike

import torch  # noqa: E402

WEIGHTS = ROOT / "weights"
PLAIN_PROMPTS, PLAIN_TOKENS = 2, 48  # the held-out prompts and new tokens a plugged-in piece is compared on


def graded_kind() -> str:
    """`starter` (the student's files, the default) or `solution` (DFLASH_LABS=solutions: the reference answers)."""
    wanted = os.environ.get("DFLASH_LABS", "starters")
    if wanted not in ("starters", "solutions"):
        raise ValueError(f"DFLASH_LABS must be 'starters' or 'solutions', not {wanted!r}")
    return wanted[:-1]


def short_name(lab: Path) -> str:
    """`01_rmsnorm` -> `rmsnorm`: the name `-k` selects a lab by."""
    return lab.name.split("_", 1)[1]


class RuleBroken(AssertionError):
    """The student's function called something its lab forbids."""


@contextlib.contextmanager
def switched_off(rule: str, places: dict[object, Sequence[str]]):
    """While the block runs, calling any `places` ({module or class: [names]}) fails with `rule`.

    How a grader enforces "without X" instead of trusting it: the student's function runs inside
    this block, the grader's own reference computations outside it.
    """
    def forbidden(name: str) -> Callable:
        def refuse(*args, **kwargs):
            raise RuleBroken(f"{rule}: your function called {name}, which this lab switches off")
        return refuse

    with contextlib.ExitStack() as stack:
        for owner, names in places.items():
            for name in names:
                label = f"{getattr(owner, '__name__', owner)}.{name}"
                stack.enter_context(mock.patch.object(owner, name, forbidden(label)))
        yield


class DemoPair:
    """The demo target, its drafter and tokenizer from weights/, loaded on first use (a starter that fails
    its first check never pays for them), one thread: tiny models run as fast and steadier on it."""

    @functools.cached_property
    def target(self):
        from dflash.qwen3 import Qwen3
        torch.set_num_threads(1)
        torch.set_grad_enabled(False)  # inference only; a lab that trains turns it back on for its block
        return Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")

    @functools.cached_property
    def drafter(self):
        from dflash.drafter import Drafter
        return Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=self.target)

    @functools.cached_property
    def tokenizer(self):
        from dflash.tokenizer import load_tokenizer
        return load_tokenizer(WEIGHTS / "tiny-qwen3")

    @property
    def block(self) -> int:
        return self.drafter.config.block_size

    @property
    def stop_ids(self) -> list[int]:
        return self.tokenizer.stop_token_ids

    @functools.cache
    def prompts(self, count: int) -> list[tuple[list[int], list[int] | None]]:
        """The first `count` held-out problems as (ids, first-token choices), through the chat template."""
        from dflash.prompts import encode_for_generation, read_prompts
        return [encode_for_generation(p, self.tokenizer) for p in read_prompts(WEIGHTS / "heldout_problems.jsonl")[:count]]

    @functools.cached_property
    def plain_answers(self) -> list[list[int]]:
        """The unmodified plain loop's tokens on the first held-out prompts: what a plugged-in piece must give."""
        from generate import generate_autoregressive
        return [generate_autoregressive(self.target, ids, PLAIN_TOKENS, stop_ids=self.stop_ids,
                                        first_token_choices=choices).new_ids for ids, choices in self.prompts(PLAIN_PROMPTS)]

    def assert_plugged_in_matches(self, plugged, loop: Callable, what: str) -> None:
        """Under `plugged` (a context manager that swaps the student's piece into the project), `loop(ids, choices,
        max_new_tokens)` (a Generation) must write the unmodified plain loop's tokens, token for token."""
        plain_answers = self.plain_answers  # computed before anything is swapped
        with plugged:
            answers = [loop(ids, choices, PLAIN_TOKENS).new_ids for ids, choices in self.prompts(PLAIN_PROMPTS)]
        for mine, plain in zip(answers, plain_answers):
            first = next((i for i, (a, b) in enumerate(zip(mine, plain)) if a != b), min(len(mine), len(plain)))
            assert mine == plain, (
                f"with {what}, the demo pair wrote {self.tokenizer.decode(mine)!r} instead of the plain loop's "
                f"{self.tokenizer.decode(plain)!r} (they part at new token {first})")


def dflash_loop(demo: DemoPair) -> Callable:
    """The chain loop on the demo pair, as `DemoPair.assert_plugged_in_matches` calls it."""
    from generate import generate_dflash
    return lambda ids, choices, limit: generate_dflash(demo.target, demo.drafter, ids, limit, stop_ids=demo.stop_ids,
                                                       first_token_choices=choices)


def tree_loop(demo: DemoPair, budget: int = 16) -> Callable:
    """The tree loop on the demo pair, as `DemoPair.assert_plugged_in_matches` calls it."""
    from generate import generate_dflash_tree
    return lambda ids, choices, limit: generate_dflash_tree(demo.target, demo.drafter, ids, limit, budget=budget,
                                                            stop_ids=demo.stop_ids, first_token_choices=choices)
