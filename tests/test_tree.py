"""Draft trees change how many tokens a step keeps, never which tokens: greedy or sampled.

The tree logic on hand-made inputs first, then the loop on the fixture pair and the
demo pair: greedy tree decoding equals plain decoding for many budgets, a tree of
single children is the chain, compaction leaves the cache as a fresh run would, the
sampled output follows the target's law, and the compiled passes compile once per
budget and obey the CUDA-graph rule on outputs.
"""

import itertools
import math
import random
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dflash import measure
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from dflash.tree import DraftTree, ancestor_mask, ancestor_mask_by_solve, build_tree, path_slots, verify_inputs, walk
from dflash.measure import Wrapped
from generate import ModelRunner, decode_pass, generate_autoregressive, generate_dflash, generate_dflash_tree
from tests.test_compile import CountingBackend, no_recompiles  # noqa: F401 (a fixture)
from tests.test_cuda_graph_rules import OverwriteEarlierOutputs
from tests.test_generate import prompt_of, random_drafter
from tests.test_sampling import PROMPT, chi_square_p_value, exact_joint, sample_counts
from tests.test_sampling import target  # noqa: F401 (the 8-token target, a fixture)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
torch.set_num_threads(1)


# ------------------------------------------------------------------ the tree logic


def test_the_tree_holds_the_likeliest_continuations_best_first():
    depth, width, budget = 4, 5, 12
    logits = torch.randn(depth, 50, generator=torch.Generator().manual_seed(0))  # (depth, vocab)
    logprobs = logits.log_softmax(dim=-1).topk(width).values  # (depth, width): each depth's best, best first
    candidates = [[100 * d + r for r in range(width)] for d in range(1, depth + 1)]
    tree = build_tree(7, logprobs.tolist(), candidates, budget)
    # Every continuation of up to `depth` tokens, as ranks per depth, with its score.
    every = [sum(logprobs[d, r].item() for d, r in enumerate(ranks))
             for length in range(1, depth + 1) for ranks in itertools.product(range(width), repeat=length)]
    assert tree.size == budget
    assert tree.scores[1:] == pytest.approx(sorted(every, reverse=True)[:budget])  # the best ones, best first
    for node in range(1, budget + 1):
        parent = tree.parents[node]
        assert parent < node and tree.depths[node] == tree.depths[parent] + 1
        assert tree.tokens[node] in candidates[tree.depths[node] - 1]  # from its depth's candidates
    assert build_tree(7, logprobs.tolist(), candidates, 1000).size == len(every)  # a budget too big: all of them


def hand_made_tree() -> DraftTree:
    """root 7 -> 10 -> 20 -> {30, 31}; root -> 11 -> 20."""
    lp = [[math.log(0.6), math.log(0.3)], [math.log(0.9), math.log(0.1)], [math.log(0.5), math.log(0.5)]]
    return build_tree(7, lp, [[10, 11], [20, 21], [30, 31]], budget=6)


def test_a_node_sees_its_ancestors_and_itself_and_padding_sees_only_itself():
    tree = hand_made_tree()
    assert tree.tokens == [7, 10, 20, 11, 30, 31, 20] and tree.parents == [-1, 0, 1, 0, 2, 2, 3]
    mask = ancestor_mask(tree.parents)
    assert [j for j in range(7) if mask[5][j]] == [0, 1, 2, 5]  # 31 sees 7, 10, 20 and itself, not 30
    assert [j for j in range(7) if mask[6][j]] == [0, 3, 6]
    tokens, depths, padded = verify_inputs(tree, budget=8)
    assert tokens.tolist() == tree.tokens + [7, 7] and depths.tolist() == [0, 1, 2, 1, 3, 3, 2, 0, 0]
    assert padded[7].tolist() == [False] * 7 + [True, False] and not padded[:7, 7:].any()


def random_tree(rng: random.Random, budget: int, depth_limit: int, shape: str) -> DraftTree:
    """A tree of at most `budget` nodes, none deeper than `depth_limit`, parents first as build_tree adds them:
    a `chain` to the limit, a `bushy` tree (parents drawn among the shallow nodes), or `random` parents."""
    tree = DraftTree.rooted_at(0)
    size = budget if shape == "chain" else rng.randrange(0, budget + 1)  # the rest is padding
    for _ in range(size):
        open_nodes = [node for node, depth in enumerate(tree.depths) if depth < depth_limit]
        if shape == "chain":  # down to the limit, then anywhere
            parent = len(tree.tokens) - 1 if tree.depths[-1] < depth_limit else rng.choice(open_nodes)
        else:
            parent = rng.choice(open_nodes[:3] if shape == "bushy" else open_nodes)
        tree.add(rng.randrange(100), parent, 0.0)
    return tree


@pytest.mark.parametrize("shape", ["chain", "bushy", "random"])
def test_the_mask_built_on_the_device_is_the_ancestor_mask(shape):
    rng = random.Random(0)
    for budget in range(1, 65):
        for depth_limit in {1, 2, 3, 15, budget}:  # 15: a block of 16's drafted slots
            tree = random_tree(rng, budget, min(depth_limit, budget), shape)
            padding = budget - tree.size
            _, _, mask = verify_inputs(tree, budget)
            assert mask.tolist() == ancestor_mask(tree.parents + [-1] * padding), (budget, depth_limit, tree.parents)
    assert ancestor_mask_by_solve(torch.arange(-1, 64))[64].all()  # a chain 64 deep: its last node sees them all


class CrossingsAndOps(TorchDispatchMode):
    """Records every op, and the shape of each tensor copied from the host to another device."""

    def __init__(self):
        super().__init__()
        self.ops, self.crossings = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(func)
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu":
            self.crossings.append(tuple(args[0].shape))
        return func(*args, **kwargs)


def test_only_tokens_depths_and_parents_cross_to_the_device_and_the_mask_needs_no_sync():
    """The meta device holds shapes and no values: anything reading a value back to the host (a sync on a
    GPU) would fail there, and the op count may not depend on the tree, only on the budget."""
    rng = random.Random(1)
    op_counts = set()
    for shape in ("chain", "bushy", "random"):
        tree = random_tree(rng, 16, 15, shape)
        with CrossingsAndOps() as seen:
            tokens, depths, mask = verify_inputs(tree, 16, "meta")
        assert seen.crossings == [(3, 17)]  # one copy: tokens, depths and parents
        assert (tokens.device.type, depths.shape, mask.shape) == ("meta", (17,), (17, 17))
        op_counts.add(len(seen.ops))
    assert len(op_counts) == 1


def test_the_walk_follows_the_targets_tokens():
    tree = hand_made_tree()
    assert walk(tree, [10, 20, 31, 0, 0, 0, 0]) == [0, 1, 2, 5]  # 31 is the second child of 20
    assert walk(tree, [11, 0, 0, 20, 0, 0, 9]) == [0, 3, 6]
    assert walk(tree, [12, 20, 31, 0, 0, 0, 0]) == [0]  # no child holds 12: only the bonus
    assert path_slots([0, 3, 6], start=40) == [40, 43, 46]  # they move to 40, 41, 42


# ------------------------------------------------------------------ the loop, greedy


@pytest.fixture(scope="module")
def pairs():
    sharded = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    demo = Qwen3.from_pretrained(ROOT / "weights" / "tiny-qwen3")
    return {
        "fixtures": (sharded, Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=sharded)),
        "demo": (demo, Drafter.from_pretrained(ROOT / "weights" / "tiny-qwen3-dflash", target=demo)),
    }


def recording_paths(runner: ModelRunner):
    """`runner`, wrapped to record every path it keeps; and the list of those paths."""
    paths = []

    class Recording(Wrapped):
        def commit_path(self, path):
            paths.append(list(path))
            return self.runner.commit_path(path)

    return Recording(runner), paths


@pytest.mark.parametrize("pair_name", ["fixtures", "demo"])
@pytest.mark.parametrize("budget", [1, 2, 5, 16, 64])
def test_greedy_tree_equals_autoregressive(pairs, pair_name, budget):
    target, drafter = pairs[pair_name]
    new, block_size = 24, drafter.config.block_size
    runner = ModelRunner(target, drafter, max_length=40 + new + max(block_size, budget + 1), tree_budget=budget)
    runner, paths = recording_paths(runner)
    for prompt_length in (1, 7, 40):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        expected = generate_autoregressive(target, prompt, new).new_ids
        result = generate_dflash_tree(target, drafter, prompt, new, budget=budget, runner=runner)
        assert result.new_ids == expected
        assert max(result.acceptance_lengths) <= min(block_size, budget + 1)
    if pair_name == "demo" and budget >= 5:  # the trained drafter: paths through second choices were kept
        assert any(path != list(range(len(path))) for path in paths)


def fresh_token_inside_a_path(ids: list[int], lengths: list[int]) -> tuple[int, int] | None:
    """(index in ids, step) of a token first seen as an accepted draft in the middle of a step's path."""
    first_of_step = [1 + sum(lengths[:step]) for step in range(len(lengths))]  # the prefill gave ids[0]
    return next(((first + k, step) for step, first in enumerate(first_of_step) for k in range(1, lengths[step] - 1)
                 if first + k < len(ids) and ids[first + k] not in ids[:first + k]), None)


def test_a_stop_token_inside_an_accepted_path_ends_the_output(pairs):
    target, drafter = pairs["demo"]
    new, budget = 64, 32  # long paths, fresh tokens in them
    for prompt_length in (1, 7, 13, 29, 40):  # the first prompt whose output has such a token
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        full = generate_dflash_tree(target, drafter, prompt, new, budget=budget)
        ids, found = full.new_ids, fresh_token_inside_a_path(full.new_ids, full.acceptance_lengths)
        if found is not None:
            break
    assert found is not None, "no prompt gave a fresh token inside an accepted path"
    cut, step = found
    streamed = []
    result = generate_dflash_tree(target, drafter, prompt, new, budget=budget, stop_ids=[ids[cut]],
                                  on_token=lambda token, drafted: streamed.append(token))
    assert result.new_ids == streamed == ids[:cut + 1]
    assert result.steps == step + 1
    assert generate_autoregressive(target, prompt, new, stop_ids=[ids[cut]]).new_ids == ids[:cut + 1]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_tree_of_single_children_is_the_chain(pairs, temperature):
    target, drafter = pairs["demo"]
    block_size, new = 16, 40
    chain_runner = ModelRunner(target, drafter, max_length=40 + new + block_size)
    tree_runner = ModelRunner(target, drafter, max_length=40 + new + block_size, tree_budget=block_size - 1,
                              tree_top_k=1)
    lengths = []
    for prompt_length in (1, 17, 40):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        seeded = dict(sampling=Sampling(temperature), generator=torch.Generator().manual_seed(prompt_length))
        chain = generate_dflash(target, drafter, prompt, new, runner=chain_runner, **seeded)
        seeded["generator"].manual_seed(prompt_length)  # the same draws: one per slot, as many slots
        tree = generate_dflash_tree(target, drafter, prompt, new, budget=block_size - 1, runner=tree_runner, **seeded)
        assert tree.new_ids == chain.new_ids
        assert tree.acceptance_lengths == chain.acceptance_lengths
        lengths += chain.acceptance_lengths
    assert max(lengths) > 1  # drafts were kept: the comparison is not between two runs of rejections


@torch.no_grad()
def test_after_compaction_the_next_logits_are_a_fresh_runs(pairs):
    target, drafter = pairs["demo"]
    prompt, budget = prompt_of(9, target.config.vocab_size), 30  # every continuation of four two-way choices
    truth = prompt + generate_autoregressive(target, prompt, 8).new_ids
    runner = ModelRunner(target, drafter, max_length=48, tree_budget=budget)
    first, features = runner.prefill(torch.tensor([prompt]), 0.0, None)
    n = len(prompt)
    runner.draft_tree(features, first)  # keeps the drafter in step; its guesses are replaced:
    # at every depth the truth is the second choice, so the true path runs through second children.
    wrong = lambda token: (token + 1) % target.config.vocab_size  # noqa: E731
    candidates = [[wrong(truth[n + d]), truth[n + d]] for d in range(1, 5)]
    tree = build_tree(first, [[-0.1, -0.2]] * 4, candidates, budget)
    target_tokens = runner.verify_tree(tree, 0.0, None).tolist()
    path = walk(tree, target_tokens)
    assert len(path) == 5 and path != list(range(5))  # four drafts kept, from scattered slots
    context = runner.commit_path(path)
    assert [target_tokens[node] for node in path] == truth[n + 1:n + 6]  # four drafts and the bonus
    assert runner.target_cache.length == n + 5  # the prompt, the root and the four drafts
    bonus = torch.tensor([[truth[n + 5]]])
    cached = decode_pass(target, runner.target_cache, bonus, torch.tensor([n + 5]))  # (1, vocab)
    hidden, fresh_features = target(torch.tensor([truth[:n + 6]]), capture_layers=drafter.config.target_layer_ids)
    assert (cached - target.logits(hidden[:, -1])).abs().max() <= 1e-5
    # The drafter's next context: the features of the root and the kept path, in order.
    # Features reach tens in size: a float32 difference of a few 1e-5 is summation order, not a stale slot.
    torch.testing.assert_close(context[:, :5], fresh_features[:, n:n + 5], atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the loop, sampled


def test_tree_sampling_follows_the_target(target):  # noqa: F811
    block_size, budget = 4, 6  # three depths of up to six of the eight tokens: most draws land on a child
    drafter = random_drafter(target, block_size=block_size, num_layers=1)
    generator = torch.Generator().manual_seed(3)
    runner = ModelRunner(target, drafter, max_length=len(PROMPT) + 3 + budget + 1, tree_budget=budget)
    lengths = []

    def generate():
        result = generate_dflash_tree(target, drafter, PROMPT, 3, budget=budget, sampling=Sampling(1.0),
                                      generator=generator, runner=runner)
        lengths.extend(result.acceptance_lengths)
        return result.new_ids

    counts = sample_counts(generate)
    assert sum(lengths) / len(lengths) > 1.3  # drafts were accepted often: the walk was exercised
    assert chi_square_p_value(counts, exact_joint(target, 1.0)) > 1e-3
    assert chi_square_p_value(counts, exact_joint(target, 1.25)) < 1e-3  # and the test has power


# ------------------------------------------------------- compiled, and under CUDA graphs


@pytest.mark.parametrize("budget", [4, 16])
def test_tree_passes_compile_once_per_budget(pairs, no_recompiles, budget):
    target, drafter = pairs["demo"]
    backend, new = CountingBackend(), 48
    runner = ModelRunner(target, drafter, max_length=40 + new + 16 + budget, tree_budget=budget, compile=True,
                         backend=backend)
    counts, lengths = [], []
    for prompt_length in (5, 23, 40) * 2:
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        result = generate_dflash_tree(target, drafter, prompt, new, budget=budget, runner=runner)
        assert result.new_ids == generate_autoregressive(target, prompt, new).new_ids
        counts.append(backend.graphs)
        lengths += result.acceptance_lengths
    # The tree's draft and verify passes: one graph each per bucket of slots read (`keys_bucket`: 64, 128, and
    # the whole buffer where it is shorter), and none for the second round over the same lengths.
    assert 2 <= counts[0] and counts[2] <= 6 and counts[3:] == [counts[2]] * 3
    assert len(set(lengths)) >= 3  # the steps did run with different acceptance lengths


def test_greedy_tree_equals_the_plain_loop_under_the_cuda_graph_rule(pairs):
    torch._dynamo.reset()
    target, drafter = pairs["demo"]
    new, budget = 24, 16
    rule = OverwriteEarlierOutputs()
    runner = ModelRunner(target, drafter, max_length=31 + new + budget + 1, tree_budget=budget, compile=True,
                         backend=rule)
    for prompt_length in (1, 6, 31):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        eager = generate_dflash_tree(target, drafter, prompt, new, budget=budget)
        spoiled = generate_dflash_tree(target, drafter, prompt, new, budget=budget, runner=runner)
        assert spoiled.new_ids == eager.new_ids == generate_autoregressive(target, prompt, new).new_ids
        assert spoiled.acceptance_lengths == eager.acceptance_lengths  # spoiled candidates or features would show here
    assert rule.calls > 10
    torch._dynamo.reset()


# ------------------------------------------------------------- the command lines


def test_generate_py_tree_option_writes_the_plain_loops_output(capsys):
    import json

    import generate

    argv = ["--prompt-ids", "5,17,42,99", "--model", str(FIXTURES / "qwen3-tiny-sharded"),
            "--draft", str(FIXTURES / "dflash-tiny"), "--max-new-tokens", "12", "--compare", "--json"]
    assert generate.main(argv + ["--tree", "8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output_ids"] == report["baseline_output_ids"] and len(report["output_ids"]) == 12
    assert generate.main(argv + ["--tree", "-1"]) == 2  # one error line, as for any bad input


def test_bench_py_puts_trees_beside_the_chain(tmp_path):
    import json

    import bench

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n" for ids in ([5, 17, 42, 99], [400, 7, 300])))
    out = tmp_path / "bench.json"
    assert bench.main(["--model", str(FIXTURES / "qwen3-tiny-sharded"), "--draft", str(FIXTURES / "dflash-tiny"),
                       "--prompts", str(prompts), "--max-new-tokens", "9", "--block-sizes", "4", "8",
                       "--trees", "3", "--no-oracle", "--json", str(out)]) == 0
    rows = {(row["kind"], row["block_size"]): row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("DFlash", 4), ("DFlash", 8), ("tree 3", 8)}  # the tree at the largest block
    tree = rows["tree 3", 8]
    assert all(p["identical_to_baseline"] for p in tree["per_prompt"])
    assert set(tree["all"]["per_step_ms"]) == {"draft", "verify", "accept_and_bookkeeping"}
    assert set(tree["all"]["versus_chain"]) == {"tau", "step_cost", "speedup"}
    assert measure.step_ms({"draft": 1.0, "verify": 2.0, "accept_and_bookkeeping": 0.5}) == 3.5
    assert measure.step_ms({"draft": 1.0, "verify": None}) is None
