"""What a tree step or a sampled step costs outside the model passes, before and after issue 29, on one CPU thread.

    python benchmarks/step_overheads.py
    python benchmarks/step_overheads.py --rounds 40 --budgets 16 64 --vocab 151936

The tree's verify inputs at each budget (trees built best first from a block of 16's 15 drafted slots): before,
the ancestor mask built as Python lists and three tensors made on the host, each then copied to the device; after,
`verify_inputs`: tokens, depths and parents in one (3, N+1) tensor, the mask built where the pass runs, by one
triangular solve. On this CPU the copies cost nothing, so the figures are the host's work alone; the copies and the
tensor ops (kernels, on a GPU) are counted. Sampling at Qwen3's vocabulary, 15 and 16 rows (a chain's drafted
slots, a verified block): `sample` with the softmax in float64 (before) and in float32 (after; the sums stay float64).
Each figure is the least over interleaved rounds: the machine is shared, and the ratios are what count.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dflash.sampling
from bench_common import least_time, print_table
from dflash.cli import OneLineErrors, checked, run_cli
from dflash.sampling import Sampling, sample
from dflash.tree import DraftTree, ancestor_mask, build_tree, verify_inputs, walk

BLOCK = 16  # the demo drafter's block: trees are at most 15 deep
POLICIES = (Sampling(0.6), Sampling(0.6, top_k=20, top_p=0.95), Sampling(0.7, top_p=0.8))  # Qwen3's is the second


def host_built_inputs(tree: DraftTree, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify inputs as they were built before: the mask as Python lists, three tensors on the host."""
    padding = budget - tree.size
    tokens = tree.tokens + [tree.tokens[0]] * padding
    depths = tree.depths + [0] * padding
    mask = ancestor_mask(tree.parents + [-1] * padding)  # O(N^2) Python
    return torch.tensor(tokens), torch.tensor(depths), torch.tensor(mask)


def float64_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The softmax as `Sampling.probs` took it before: all of it in float64."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def drafter_outputs(budget: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random drafter log-probabilities and candidates over a block's drafted slots: (slots, budget) each,
    as `ModelRunner.draft_tree` returns them (its top-k is the budget)."""
    logits = torch.randn(BLOCK - 1, 1000, generator=torch.Generator().manual_seed(seed)) * 3  # (slots, vocab)
    return logits.log_softmax(dim=-1).topk(budget, dim=-1)


def drafted_tree(budget: int, seed: int) -> DraftTree:
    """A best-first tree of `budget` nodes, as the tree loop builds one."""
    logprobs, candidates = drafter_outputs(budget, seed)
    return build_tree(0, logprobs.tolist(), candidates.tolist(), budget)


def each_alone(jobs: dict[str, Callable[[], object]]) -> dict[str, dict[str, Callable[[], object]]]:
    """Jobs for `least_time`, each called back to back on its own (they are alternatives, not a loop's passes)."""
    return {name: {name: job} for name, job in jobs.items()}


class DeviceOps(TorchDispatchMode):
    """Counts the ops that run on the device (views aside: they launch nothing), and the host tensors copied there."""

    def __init__(self, device: str):
        super().__init__()
        self.device, self.ops, self.copies = device, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.device.type == self.device and not func.is_view:
            self.ops += 1
            if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu":
                self.copies.append(args[0].numel())
        return out


def counted(build: Callable[[], Sequence[torch.Tensor]]) -> DeviceOps:
    """The device ops and copies of `build`, its outputs sent to the meta device, as `verify_tree` sends them to a
    GPU (the meta device holds no values: nothing can be read back from it)."""
    with DeviceOps("meta") as seen:
        for tensor in build():
            tensor.to("meta")  # a no-op for what is already there
    return seen


def tree_rows(budgets: Sequence[int], rounds: int) -> list[list]:
    """Per budget: before and after in microseconds, after's speedup, and each one's copies and device ops."""
    lines = []
    for budget in budgets:
        tree = drafted_tree(budget, seed=budget)
        jobs = {"before": lambda: host_built_inputs(tree, budget), "after": lambda: verify_inputs(tree, budget)}
        best = least_time(each_alone(jobs), rounds, calls=20)
        before = counted(lambda: host_built_inputs(tree, budget))
        after = counted(lambda: verify_inputs(tree, budget, "meta"))
        lines.append([budget, 1e6 * best["before"], 1e6 * best["after"], best["before"] / best["after"],
                      *(f"{len(seen.copies)}: {sum(seen.copies)} values" for seen in (before, after)),
                      before.ops, after.ops])
    return lines


def host_rows(budgets: Sequence[int], rounds: int) -> list[list]:
    """Per budget, in microseconds, the host's work between the tree step's two syncs and after the second, while a
    GPU would wait: reading the draft (sync 1), building the tree, its verify inputs, the walk (after sync 2)."""
    lines = []
    for budget in budgets:
        logprobs, candidates = drafter_outputs(budget, seed=budget)
        tree = drafted_tree(budget, seed=budget)
        target_tokens = [tree.tokens[node] for node in range(1, budget + 1)] + [0]  # a walk down the first children
        jobs = {"read": lambda: (logprobs.tolist(), candidates.tolist()),
                "build": lambda: build_tree(0, logprobs.tolist(), candidates.tolist(), budget),
                "inputs": lambda: verify_inputs(tree, budget), "walk": lambda: walk(tree, target_tokens)}
        best = least_time(each_alone(jobs), rounds, calls=20)
        lines.append([budget, *(1e6 * best[name] for name in ("read", "build", "inputs", "walk"))])
    return lines


def sampling_rows(vocab: int, rounds: int) -> list[list]:
    """Per rows: the softmax alone, then `sample` per policy, with the float64 softmax and the float32 one, in ms."""
    lines, generator = [], torch.Generator().manual_seed(0)
    for rows in (BLOCK - 1, BLOCK):
        logits = torch.randn(rows, vocab, generator=generator) * 3  # (rows, vocab): a long tail...
        logits[:, :5] += 12  # ...under a few likely tokens
        softmaxes = {"before": lambda: float64_softmax(logits, 0.6),
                     "after": lambda: dflash.sampling.tempered_softmax(logits, 0.6)}
        best = least_time(each_alone(softmaxes), rounds, calls=1)
        lines.append([rows, "softmax alone", 1e3 * best["before"], 1e3 * best["after"], best["before"] / best["after"]])
        for policy in POLICIES:
            def before():
                with mock.patch.object(dflash.sampling, "tempered_softmax", float64_softmax):
                    return sample(logits, policy, generator)
            samplers = {"before": before, "after": lambda: sample(logits, policy, generator)}
            best = least_time(each_alone(samplers), rounds, calls=1)
            lines.append([rows, str(policy), 1e3 * best["before"], 1e3 * best["after"], best["before"] / best["after"]])
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    positive = checked(int, "at least 1", lambda x: x >= 1)
    p.add_argument("--rounds", type=positive, default=30, help="interleaved rounds; each figure is the least")
    p.add_argument("--budgets", type=positive, nargs="+", default=[16, 64], help="tree budgets (drafted nodes)")
    # 16 rows of float64 logits each: past 2**20 is no model's vocabulary, 2**40 no machine's memory
    vocab = checked(int, "in 2..2**20", lambda x: 2 <= x <= 2**20)
    p.add_argument("--vocab", type=vocab, default=151_936,
                   help="vocabulary sampled over (Qwen3's by default)")
    return p


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)  # one thread: steadier on a shared machine, and the figures are per core
    print_table("The tree's verify inputs, per step (microseconds; block 16)",
                [("budget", "d"), ("before", ".1f"), ("after", ".1f"), ("speedup", ".2fx"),
                 ("copies before", "s"), ("copies after", "s"), ("device ops before", "d"), ("after", "d")],
                tree_rows(args.budgets, args.rounds))
    print_table("The host's work per tree step, around its two syncs (microseconds; build includes the read)",
                [("budget", "d"), ("read the draft", ".1f"), ("build the tree", ".1f"), ("verify inputs", ".1f"),
                 ("walk", ".1f")], host_rows(args.budgets, args.rounds))
    print_table(f"Sampling over {args.vocab} tokens, per step (milliseconds; softmax in float64 before, float32 after)",
                [("rows", "d"), ("policy", "s"), ("before", ".2f"), ("after", ".2f"), ("speedup", ".2fx")],
                sampling_rows(args.vocab, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), run))
