"""Grades lab 09_capstone_tree: the student's tree loop, on runners the grader builds, on cases
drawn at run time (the demo pair, budgets from 2 to 24, prompts of several lengths, a held-out
problem stopping at a stop token). Its output must be the plain loop's; the project's own tree
loop and walk are not needed (in the student copy they are this lab's stubs).

Every call the student's loop makes on the runner is recorded with what the runner returned, and
each step is checked against what those returns ask of it: the best-first tree over the drafter's
candidates verified, rooted at the newest committed token; a committed path that opens at the root,
goes from each node to its child holding the target's token there, and ends where no child does.
A wrong step is named by what went wrong in it."""

import generate
import dflash.tree
from _lab_helpers import drawn_random, forbidden
from dflash.measure import Wrapped
from dflash.tree import build_tree

RULE = "09_capstone_tree: the lab asks you to write the walk and the loop yourself"
FORBIDDEN = {generate: ["generate_dflash", "generate_autoregressive", "generate_dflash_tree",
                        "GenerationBuilder", "ready_runner", "walk"],
             dflash.tree: ["walk"]}


class Recording(Wrapped):
    """A runner whose calls are recorded, in order, with what it returned: ("draft", context rows,
    last, the best-first tree over its candidates), ("verify", the tree given, the target's token
    after each of its nodes), ("commit", path); `first`: the prefill's token."""

    def __init__(self, runner, budget: int):
        super().__init__(runner)
        self.calls, self.budget, self.first = [], budget, None

    def prefill(self, *args, **options):
        token, features = self.runner.prefill(*args, **options)
        self.first = int(token)
        return token, features

    def draft_tree(self, features, last):
        logprobs, candidates = self.runner.draft_tree(features, last)
        tree = build_tree(int(last), logprobs.tolist(), candidates.tolist(), self.budget)
        self.calls.append(("draft", features.shape[1], int(last), tree))
        return logprobs, candidates

    def verify_tree(self, tree, *args, **options):
        target_tokens = self.runner.verify_tree(tree, *args, **options)
        self.calls.append(("verify", (list(tree.tokens), list(tree.parents)),
                           target_tokens.tolist()[:len(tree.tokens)]))
        return target_tokens

    def commit_path(self, path):
        self.calls.append(("commit", [int(node) for node in path]))
        return self.runner.commit_path(path)

    def steps(self) -> list[list[tuple]]:
        """The calls, one list per step: a step opens with a draft."""
        steps = []
        for call in self.calls:
            if call[0] == "draft" or not steps:
                steps.append([])
            steps[-1].append(call)
        return steps


def fresh_runner(target, drafter, budget: int, prompt: list[int], new: int) -> Recording:
    block = drafter.config.block_size
    return Recording(generate.ModelRunner(target, drafter, tree_budget=budget,
                                          max_length=len(prompt) + new + max(block, budget + 1)),
                     budget)


def assert_path_right(path: list[int], tree: tuple, target_tokens: list[int], where: str) -> None:
    """`path` opens at the root, each node is the child of the one before that holds the target's
    token after it, and the last has no such child."""
    tokens, parents = tree
    assert path[:1] == [0], f"{where} does not open with the root, node 0"
    for before, node in zip(path, path[1:]):
        assert 0 < node < len(tokens) and parents[node] == before \
            and tokens[node] == target_tokens[before], (
                f"{where} goes on to a node that is not the child holding the target's token "
                f"after the node before it")
    assert not any(parents[node] == path[-1] and tokens[node] == target_tokens[path[-1]]
                   for node in range(1, len(tokens))), (
        f"{where} stops before the walk from the root along the target's tokens ends")


def assert_steps_right(mine: Recording, prompt: list[int], new: int, stops, case: str) -> list[int]:
    """Step by step, what the student's loop did against what the runner's returns ask of each
    step: the first wrong call, named. The tokens each step committed."""
    rows, last, written, lengths = len(prompt), mine.first, [mine.first], []
    done = new == 1 or mine.first in stops  # the prefill's token may end the output
    for step, calls in enumerate(mine.steps()):
        kinds = [call[0] for call in calls]
        assert kinds == ["draft", "verify", "commit"], (
            f"09_capstone_tree ({case}): step {step} calls {', '.join(kinds)}; a step drafts a "
            f"tree, verifies it, then commits a path once")
        assert not done, (f"09_capstone_tree ({case}): the loop commits a path in more steps than "
                          f"it needs")
        (_, my_rows, my_last, best_first), (_, tree, target_tokens), (_, path) = calls
        assert my_rows == rows, (
            f"09_capstone_tree ({case}): step {step} drafts from the features of "
            f"{'more' if my_rows > rows else 'fewer'} positions than the last commit returned")
        assert my_last == last, (
            f"09_capstone_tree ({case}): step {step}'s tree grows from a token other than the "
            f"newest committed one (the prefill's, then the target's own after the path)")
        assert tree == (best_first.tokens, best_first.parents), (
            f"09_capstone_tree ({case}): step {step} verifies a tree other than the best-first "
            f"tree (build_tree) of the budget over runner.draft_tree's candidates")
        assert_path_right(path, tree, target_tokens,
                          f"09_capstone_tree ({case}): step {step}'s path")
        rows, last = len(path), target_tokens[path[-1]]
        lengths.append(len(path))
        for token in [target_tokens[node] for node in path]:  # the kept drafts, the target's own
            if not done:
                written.append(token)
                done = len(written) == new or token in stops
    assert done, f"09_capstone_tree ({case}): the loop commits a path in fewer steps than it needs"
    return lengths


def test_capstone_tree(lab, demo):
    rng = drawn_random()
    target, drafter = demo.target, demo.drafter
    cases = []  # (name, budget, prompt, new, stop_ids)
    for budget in rng.sample(range(2, 25), 2):
        length = rng.choice([1, rng.randint(2, 20), rng.randint(40, 100)])
        prompt = [rng.randrange(target.config.vocab_size - 1) for _ in range(length)]
        cases.append((f"budget {budget}, a {length}-token prompt", budget, prompt, rng.randint(10, 40), ()))
    budget = rng.randint(8, 24)
    cases.append((f"budget {budget}, a held-out problem", budget, demo.drawn_prompt(rng), 96,
                  tuple(demo.stop_ids)))
    # every reference before the student's code runs
    plains = [generate.generate_autoregressive(target, prompt, new, stop_ids=stops).new_ids
              for name, budget, prompt, new, stops in cases]
    with forbidden(lab, RULE, FORBIDDEN):
        for (name, budget, prompt, new, stops), plain in zip(cases, plains):
            mine = fresh_runner(target, drafter, budget, prompt, new)
            new_ids, lengths = lab.my_generate_dflash_tree(mine, prompt, new, budget, stops)
            committed = assert_steps_right(mine, prompt, new, stops, name)
            assert list(new_ids) == plain, (
                f"09_capstone_tree ({name}): your output leaves the plain loop's at new token "
                f"{next((i for i, (a, b) in enumerate(zip(new_ids, plain)) if a != b), len(new_ids))}")
            assert list(lengths) == committed, (
                f"09_capstone_tree ({name}): the acceptance lengths you return are not the tokens each "
                f"step committed (the kept drafts and the target's own token)")
