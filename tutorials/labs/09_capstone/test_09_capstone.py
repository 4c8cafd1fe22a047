"""Grades lab 09_capstone: the student's speculative loop, on runners the grader builds, on cases
drawn at run time: the demo pair and a fixture pair, block sizes from 2 to 16, prompts of several
lengths (random ids, and held-out problems stopping at a stop token). Its output must be the plain
loop's; the project's own DFlash loop is not needed (in the student copy it is this lab's stub).

Every call the student's loop makes on the runner is recorded with what the runner returned, and
each step is checked against what those returns ask of it: the drafter's likeliest tokens verified,
`last` and the drafts before the first the target disagrees with committed, the target's own token
opening the next block, the features of what was committed drafted from. A wrong step is named by
what went wrong in it, without the value it should have had, and a loop that raises is named in one
line, not by a traceback from inside the model. The limits include 0 and 1, and a stop token the
prefill itself writes. The tokens a step brings to the host are counted (every .item(), .tolist(),
int() or comparison read in Python outside the runner): once per step. The project's loops are
switched off while the student's runs; every reference is computed before."""

import contextlib

import torch
from torch.overrides import TorchFunctionMode

import generate
from _lab_helpers import ROOT, drawn_random, forbidden, run_dflash
from dflash.drafter import Drafter
from dflash.measure import Wrapped
from dflash.qwen3 import Qwen3, argmax

RULE = "09_capstone: the lab asks you to write the loop yourself, from the runner's methods"
FORBIDDEN = {generate: ["generate_dflash", "generate_autoregressive", "generate_dflash_tree",
                        "GenerationBuilder", "ready_runner"]}
FIXTURES = ROOT / "tests" / "fixtures"


HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy,
              torch.Tensor.__format__, torch.Tensor.__repr__, torch.equal, torch.Tensor.equal,
              torch.allclose, torch.Tensor.allclose}


class HostReads(TorchFunctionMode):
    """While on, counts the calls that bring a tensor's numbers to Python (`count`), except while
    `paused`: the runner's own, and the grader's."""

    def __init__(self):
        super().__init__()
        self.count, self.paused, self.on = 0, 0, False

    def __enter__(self):
        self.on = True
        return super().__enter__()

    def __exit__(self, *error):
        self.on = False
        return super().__exit__(*error)

    @contextlib.contextmanager
    def off(self):
        """Off for the block (the runner's passes: not watched, and not slowed down), then on
        again if it was."""
        was_on = self.on
        if was_on:
            self.__exit__(None, None, None)
        try:
            yield
        finally:
            if was_on:
                self.__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused and func in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class Recording(Wrapped):
    """A runner whose calls are recorded, in order, with what it returned: ("draft", context rows,
    last, the drafter's likeliest tokens), ("verify", the drafts given, the target's tokens),
    ("commit", kept); the prefill opens the record (`first`: its token). Its calls pause `reads`
    (a HostReads), if given."""

    def __init__(self, runner, reads: HostReads | None = None):
        super().__init__(runner)
        self.calls, self.reads, self.first = [], reads or HostReads(), None

    @contextlib.contextmanager
    def unwatched(self):
        """The grader's own reads of tensors, not counted as the student's."""
        self.reads.paused += 1
        try:
            yield
        finally:
            self.reads.paused -= 1

    def prefill(self, *args, **options):
        self.calls.append(("prefill",))
        token, features = self.runner_call("prefill", *args, **options)
        with self.unwatched():
            self.first = int(token)
        return token, features

    def draft(self, features, last):
        with self.unwatched():
            self.calls.append(["draft", features.shape[1], int(last), None])
        logits = self.runner_call("draft", features, last)
        with self.unwatched():
            self.calls[-1][3] = argmax(logits).tolist()  # (block - 1,): the likeliest
        return logits

    def verify(self, drafts):
        with self.unwatched():
            self.calls.append(["verify", torch.as_tensor(drafts).tolist(), None])
        target_tokens, features = self.runner_call("verify", drafts)
        with self.unwatched():
            self.calls[-1][2] = target_tokens.tolist()  # (block,)
        return target_tokens, features

    def commit(self, kept):
        with self.unwatched():
            self.calls.append(("commit", int(kept)))
        return self.runner_call("commit", kept)

    def runner_call(self, name: str, *args, **options):
        self.reads.paused += 1
        try:
            with self.reads.off():
                return getattr(self.runner, name)(*args, **options)
        except Exception as error:  # a wrong argument: the student's step is at fault
            raise WrongCall(f"runner.{name} raised {type(error).__name__}") from error
        finally:
            self.reads.paused -= 1

    def steps(self) -> list[list[tuple]]:
        """The calls after the prefill, one list per step: a step opens with a draft."""
        steps = []
        for call in self.calls[1:]:
            if call[0] == "draft" or not steps:
                steps.append([])
            steps[-1].append(call)
        return steps


class WrongCall(Exception):
    """A runner method raised on what the student's loop passed it."""


def fresh_runner(target, drafter, block: int, prompt: list[int], new: int, reads=None) -> Recording:
    return Recording(generate.ModelRunner(target, drafter, block_size=block,
                                          max_length=len(prompt) + max(new, 1) + block), reads)


def mid_step_token(target, drafter, block: int, prompt: list[int], new: int) -> list[int]:
    """The last token generate_dflash first commits inside a step, not at its end: as a stop token,
    it checks that a loop stops mid-step, after as many steps as can be ([] if there is none)."""
    result = run_dflash(target, drafter, prompt, new, block_size=block)
    ids, start, found = result.new_ids, 1, []  # the prefill wrote ids[0]
    for length in result.acceptance_lengths:
        fresh = [i for i in range(start, min(start + length - 1, len(ids))) if ids[i] not in ids[:i]]
        found = [ids[fresh[-1]]] if fresh else found
        start += length
    return found


def first_difference(mine: list, right: list) -> int:
    return next((i for i, (a, b) in enumerate(zip(mine, right)) if a != b), min(len(mine), len(right)))


def accepted_prefix(drafts: list[int], target_tokens: list[int]) -> int:
    """How many drafts open the block in agreement with the target's tokens."""
    pairs = list(zip(drafts, target_tokens))
    return next((k for k, (draft, token) in enumerate(pairs) if draft != token), len(pairs))


def assert_steps_right(mine: Recording, prompt: list[int], new: int, stops, case: str,
                       finished: bool = True) -> list[int]:
    """Step by step, what the student's loop did against what the runner's returns ask of each
    step: the first wrong call, named. Of a loop that did not finish (it raised), the steps it
    took. The tokens each step committed, as a finished loop should return them."""
    assert mine.calls[:1] == [("prefill",)], f"09_capstone ({case}): the loop must open with runner.prefill"
    rows, last, written, lengths = len(prompt), mine.first, [mine.first], []
    done = new == 1 or mine.first in stops  # the prefill's token may end the output
    for step, calls in enumerate(mine.steps()):
        kinds = [call[0] for call in calls]
        if not finished and len(calls) < 3:
            break  # the step it raised in
        assert kinds == ["draft", "verify", "commit"], (
            f"09_capstone ({case}): step {step} calls {', '.join(kinds)}; a step drafts, verifies, "
            f"then commits once")
        assert not done, (
            f"09_capstone ({case}): the loop takes more steps than it needs: it stops at the limit "
            f"or after a stop token, no sooner")
        (_, my_rows, my_last, likeliest), (_, drafts, target_tokens), (_, kept) = calls
        assert my_rows == rows, (
            f"09_capstone ({case}): step {step} drafts from the features of "
            f"{'more' if my_rows > rows else 'fewer'} positions than the drafter has not seen yet: "
            f"the prompt's after the prefill, then what the last commit returned")
        assert my_last == last, (
            f"09_capstone ({case}): step {step}'s block opens with a token other than the newest committed "
            f"one (the prefill's token, then the target's own token after the accepted drafts)")
        assert drafts == likeliest, (
            f"09_capstone ({case}): step {step} verifies tokens other than the drafter's likeliest "
            f"after `last` (the argmax of runner.draft's logits, the whole block)")
        right_kept = accepted_prefix(drafts, target_tokens) + 1
        assert kept == right_kept, (
            f"09_capstone ({case}): step {step} commits one position too {'many' if kept > right_kept else 'few'}"
            f" (it keeps `last` and the drafts the target agrees with, up to the first it does not)"
            if abs(kept - right_kept) == 1 else
            f"09_capstone ({case}): step {step} commits {'more' if kept > right_kept else 'fewer'} positions "
            f"than `last` and the drafts before the first the target disagrees with")
        rows, last = kept, target_tokens[kept - 1]  # the target's own token after the kept drafts
        lengths.append(kept)
        for token in target_tokens[:kept]:  # the kept drafts, then the target's own token
            if not done:
                written.append(token)
                done = len(written) == new or token in stops
    assert not finished or done, (
        f"09_capstone ({case}): the loop takes fewer steps than it needs: it stops at the limit or "
        f"after a stop token, no sooner")
    return lengths


def test_capstone(lab, demo):
    rng = drawn_random()
    fixture_target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    pairs = {"the demo pair": (demo.target, demo.drafter),
             "a fixture pair": (fixture_target, Drafter.from_pretrained(FIXTURES / "dflash-tiny",
                                                                        target=fixture_target))}
    cases = []  # (name, target, drafter, block, prompt, new, stop_ids)
    for name, (target, drafter) in pairs.items():
        for block in rng.sample(range(2, drafter.config.block_size + 1), 2):
            length = rng.choice([1, rng.randint(2, 20), rng.randint(40, 120)])
            prompt = [rng.randrange(target.config.vocab_size - 1) for _ in range(length)]
            cases.append((f"{name}, block {block}, a {length}-token prompt", target, drafter, block,
                          prompt, rng.randint(10, 50), ()))
    problem = demo.drawn_prompt(rng)
    stops = tuple(demo.stop_ids) + tuple(mid_step_token(demo.target, demo.drafter, 16, problem, 96))
    cases.append(("the demo pair, block 16, a held-out problem", demo.target, demo.drafter, 16, problem,
                  96, stops))
    short = [rng.randrange(demo.target.config.vocab_size - 1) for _ in range(rng.randint(2, 20))]
    first = generate.generate_autoregressive(demo.target, short, 1).new_ids  # the prefill's token
    cases += [("the demo pair, max_new_tokens 1", demo.target, demo.drafter, 16, short, 1, ()),
              ("the demo pair, a stop token the prefill writes", demo.target, demo.drafter, 16,
               short, 20, tuple(first))]
    # Every reference before the student's code runs (and with the plain loop switched on).
    plains = [generate.generate_autoregressive(target, prompt, new, stop_ids=stops).new_ids
              for name, target, drafter, block, prompt, new, stops in cases]
    mine_all, reads = [], HostReads()
    with forbidden(lab, RULE, FORBIDDEN):
        nothing = fresh_runner(demo.target, demo.drafter, 16, short, 0)
        with reads:
            none_asked = lab.my_generate_dflash(nothing, short, 0, ())
        assert [list(part) for part in none_asked] == [[], []], (
            "09_capstone: with max_new_tokens 0 the loop writes no token and takes no step")
        for name, target, drafter, block, prompt, new, stops in cases:
            mine = fresh_runner(target, drafter, block, prompt, new, reads)
            reads.count = 0
            try:
                with reads:
                    new_ids, lengths = lab.my_generate_dflash(mine, prompt, new, stops)
            except NotImplementedError:
                raise  # not written yet
            except Exception as error:
                assert_steps_right(mine, prompt, new, stops, name, finished=False)  # the wrong step
                steps = len(mine.steps())
                what = (f"{error} on what your loop passed it" if isinstance(error, WrongCall) else
                        f"your loop raised {type(error).__name__}")
                raise AssertionError(
                    f"09_capstone ({name}): {what} in step {max(steps - 1, 0)}, after the calls "
                    f"{', '.join(call[0] for call in mine.calls[-4:])} (--tb=long shows where)"
                ) from error
            steps = len(mine.steps())
            assert reads.count <= steps, (
                f"09_capstone ({name}): your loop read tensors into Python {reads.count} times in "
                f"{steps} steps: a step's tokens reach the host once (bring both tensors over in "
                "one call)")
            mine_all.append((mine, list(new_ids), list(lengths)))
    for (name, _, _, _, prompt, new, stops), plain, (mine, new_ids, lengths) in zip(
            cases, plains, mine_all):
        committed = assert_steps_right(mine, prompt, new, stops, name)
        assert new_ids == plain, (
            f"09_capstone ({name}): your output leaves the plain loop's at new token "
            f"{first_difference(new_ids, plain)} ({len(new_ids)} tokens written)")
        assert lengths == committed, (
            f"09_capstone ({name}): the acceptance lengths you return are not the tokens each step "
            f"committed (the target's own token counts, and a step past the limit counts whole)")
