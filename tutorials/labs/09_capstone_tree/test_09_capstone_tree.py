"""Grades lab 09_capstone_tree: the student's tree loop, on runners the grader builds, against the plain
loop and generate_dflash_tree, on cases drawn at run time (the demo pair, budgets from 2 to 24, prompts
of several lengths, a held-out problem stopping at a stop token). The paths the student commits are
recorded beside generate_dflash_tree's: a wrong step is named by what went wrong in it."""

import generate
import dflash.tree
from _lab_helpers import drawn_random, forbidden
from dflash.measure import Wrapped

RULE = "09_capstone_tree: the lab asks you to write the walk and the loop yourself"
FORBIDDEN = {generate: ["generate_dflash", "generate_autoregressive", "generate_dflash_tree",
                        "GenerationBuilder", "ready_runner", "walk"],
             dflash.tree: ["walk"]}


class Recording(Wrapped):
    """A runner whose committed paths are recorded, one per step."""

    def __init__(self, runner):
        super().__init__(runner)
        self.paths = []

    def commit_path(self, path):
        self.paths.append([int(node) for node in path])
        return self.runner.commit_path(path)


def fresh_runner(target, drafter, budget: int, prompt: list[int], new: int) -> Recording:
    block = drafter.config.block_size
    return Recording(generate.ModelRunner(target, drafter, tree_budget=budget,
                                          max_length=len(prompt) + new + max(block, budget + 1)))


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
    references = []  # every reference before the student's code runs
    for name, budget, prompt, new, stops in cases:
        plain = generate.generate_autoregressive(target, prompt, new, stop_ids=stops).new_ids
        right = fresh_runner(target, drafter, budget, prompt, new)
        result = generate.generate_dflash_tree(target, drafter, prompt, new, budget=budget,
                                               stop_ids=stops, runner=right)
        references.append((plain, right, result))
    with forbidden(lab, RULE, FORBIDDEN):
        for (name, budget, prompt, new, stops), (plain, right, result) in zip(cases, references):
            mine = fresh_runner(target, drafter, budget, prompt, new)
            new_ids, lengths = lab.my_generate_dflash_tree(mine, prompt, new, budget, stops)
            for step, (path, right_path) in enumerate(zip(mine.paths, right.paths)):
                assert path[:1] == [0], (
                    f"09_capstone_tree ({name}): step {step}'s path does not open with the root, node 0")
                assert path == right_path, (
                    f"09_capstone_tree ({name}): step {step} commits a path "
                    f"{'longer' if len(path) > len(right_path) else 'shorter' if len(path) < len(right_path) else 'as long but through other nodes'}"
                    f" than the walk from the root along the target's tokens")
            assert len(mine.paths) == len(right.paths), (
                f"09_capstone_tree ({name}): the loop commits a path in "
                f"{'more' if len(mine.paths) > len(right.paths) else 'fewer'} steps than it needs")
            assert list(new_ids) == plain, (
                f"09_capstone_tree ({name}): your output leaves the plain loop's at new token "
                f"{next((i for i, (a, b) in enumerate(zip(new_ids, plain)) if a != b), len(new_ids))}")
            assert list(lengths) == result.acceptance_lengths, (
                f"09_capstone_tree ({name}): the acceptance lengths you return are not the tokens each "
                f"step committed (the kept drafts and the target's own token)")
