"""What the graders share: the demo pair (loaded once, and only when a grader first needs it), the plain
loop's answers to compare a plugged-in piece against, and the tools that enforce a lab's rules.

The graders never hold an answer: they compare with the project's own code, with a simulation, or
with a property the answer must have, and they switch off the calls a lab forbids while the
student's function runs. The student's module runs in the grader's process, so it is read before
it runs (`load_submission`: what it imports, what it reaches into) and the namespaces a verdict
depends on are compared before and after it (`Untouched`); a forbidden call is seen by what it
runs, whatever name it goes by (`calls_watched`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
import random
import sys
import types
from pathlib import Path
from typing import Callable, Sequence
from unittest import mock

import torch

import generate
import teaching  # tutorials/teaching.py (on pytest's path, pyproject.toml): notebook 8's pass costs
from dflash.drafter import Drafter, DrafterConfig, default_target_layer_ids
from dflash.measure import certain_logits
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3, Qwen3Config, argmax
from dflash.sampling import Sampling
from dflash.tokenizer import load_tokenizer
from dflash.tree import build_tree
from generate import (GenerationBuilder, ModelRunner, cache_slots, default_block_size,
                      generate_autoregressive)

LABS = Path(__file__).resolve().parent
ROOT = LABS.parents[1]  # the repository: dflash/, generate.py, weights/

WEIGHTS = ROOT / "weights"
FIXTURES = ROOT / "tests" / "fixtures"  # the second pair: FixturePair
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


def drawn_seed() -> int:
    """The seed a grader draws its inputs from: a new one at every run, so that no answer can be
    written down from one run's messages; DFLASH_LABS_SEED fixes it, to replay a run."""
    fixed = os.environ.get("DFLASH_LABS_SEED")
    return int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")


def drawn_generator() -> torch.Generator:
    """A torch generator seeded by `drawn_seed`: the inputs of one grading."""
    return torch.Generator().manual_seed(drawn_seed())


def drawn_random() -> random.Random:
    """A Python random source seeded by `drawn_seed`."""
    return random.Random(drawn_seed())


class RuleBroken(AssertionError):
    """The student's function called something its lab forbids."""


# ------------------------------------------------------------------ what a submission may do
# The student's module runs inside the grader's process, so it is read before it runs: it may
# import only what a lab needs, and may not reach the machinery that could change a verdict (the
# import system, the interpreter's modules, frames, a function's code, the graders, their helpers).
ALLOWED_IMPORTS = {"__future__", "math", "cmath", "heapq", "bisect", "functools", "itertools",
                   "collections", "dataclasses", "typing", "statistics", "fractions", "torch",
                   "torch.nn", "torch.nn.functional", "dflash", "generate", "train"}
BANNED_NAMES = {"eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "vars",
                "globals", "locals", "breakpoint", "input", "memoryview", "__import__",
                "__builtins__", "__file__", "__loader__", "__spec__"}
BANNED_ATTRIBUTES = {"sys", "os", "modules", "builtins", "importlib", "subprocess", "gc", "inspect",
                     "ctypes", "threading", "signal", "library", "ops", "overrides", "utils",
                     "setprofile", "settrace", "mock", "unittest", "pathlib", "Path", "shutil",
                     "pickle", "marshal", "f_globals", "f_back", "f_locals", "f_code", "tb_frame",
                     "gi_frame", "cr_frame"}


def banned_import(node: ast.Import | ast.ImportFrom) -> str | None:
    """What an import statement brings in that no lab allows, in words, or None."""
    if isinstance(node, ast.ImportFrom) and node.level:
        return "a relative import"
    for alias in node.names:
        module = node.module if isinstance(node, ast.ImportFrom) else alias.name
        if not (module in ALLOWED_IMPORTS or module.split(".")[0] == "dflash"):
            return f"import of {module} (a lab imports torch, math, dflash, generate, train only)"
        if alias.name.startswith(("_", "simulated")) or alias.name in BANNED_ATTRIBUTES:
            return f"import of {alias.name}"
    return None


def store_into_import(tree: ast.Module) -> str | None:
    """The name of an import an assignment reaches into (`torch.allclose = ...`,
    `generate.PASSES[...] = ...`), or None."""
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if target is not root and isinstance(root, ast.Name) and root.id in imported:
                return root.id
    return None


def source_rule_broken(tree: ast.Module) -> str | None:
    """What in a submission's syntax tree no lab allows, in words, or None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and banned_import(node):
            return banned_import(node)
        if isinstance(node, ast.Name) and (node.id in BANNED_NAMES
                                           or node.id.startswith("simulated")
                                           or node.id.startswith("__") and node.id != "__name__"):
            return f"the name {node.id}"
        if isinstance(node, ast.Attribute) and (node.attr.startswith(("_", "simulated", "test_"))
                                                or node.attr in BANNED_ATTRIBUTES):
            return f"the attribute .{node.attr}"
        if isinstance(node, ast.ExceptHandler) and (
                node.type is None or isinstance(node.type, ast.Name)
                and node.type.id == "BaseException"):
            return "an except clause that catches everything (the grader's time limit included)"
    stored = store_into_import(tree)
    return f"an assignment into {stored}, which the module imported" if stored else None


def watched_namespaces() -> dict[str, object]:
    """{name: module or class} of what a verdict depends on: torch, its tensors and functions,
    math, builtins, the project's modules, the graders and their helpers."""
    spaces = {"torch.Tensor": torch.Tensor, "builtins": sys.modules["builtins"]}
    whole = ("math", "torch", "torch.nn.functional", "generate", "train", "teaching",
             "_lab_helpers")
    for name, module in list(sys.modules.items()):
        if (name in whole or name.startswith(("dflash", "test_", "grader_"))
                or name.endswith("conftest")):
            spaces[name] = module
    return spaces


class Untouched:
    """A snapshot of `watched_namespaces`: `check(what)` fails with RuleBroken if a value the
    snapshot holds was replaced or removed since (a patched torch.allclose, a grader's function
    swapped), once every such value is put back. New names may come: an import adds them."""

    def __init__(self):
        self.owners = watched_namespaces()
        # Dunder names are left out: torch.compile writes its own into a compiled function's module
        # (`__builtins_dict___0`), and a submission cannot reach them (`source_rule_broken`).
        self.values = {(space, key): value for space, owner in self.owners.items()
                       for key, value in list(vars(owner).items()) if not key.startswith("__")}

    def check(self, what: str) -> None:
        changed = [(space, key) for (space, key), value in self.values.items()
                   if vars(self.owners[space]).get(key, self) is not value]
        for space, key in changed:  # put back: what runs next in this process is not fooled
            setattr(self.owners[space], key, self.values[space, key])
        if changed:
            space, key = changed[0]
            raise RuleBroken(f"{what}: your code changed {space}.{key}; a submission may change "
                             "nothing of torch, the project or the grader")


def load_submission(path: Path, name: str, lab: str):
    """The student's module at `path`, read before it runs (`source_rule_broken`), and imported
    under a watch (`Untouched`): RuleBroken, naming what is not allowed, if either fails. `lab`
    opens the message."""
    problem = source_rule_broken(ast.parse(Path(path).read_text(), filename=str(path)))
    if problem:
        raise RuleBroken(f"{lab}: your module uses {problem}, which no lab allows")
    untouched = Untouched()
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    untouched.check(lab)
    return module


def code_objects(value) -> set:
    """The code objects a Python callable runs: a function's own and those it wraps (`__wrapped__`),
    a class's methods. Empty for what is written in C."""
    codes, seen = set(), set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type):
            stack += [member for member in vars(item).values()
                      if isinstance(member, (types.FunctionType, staticmethod, classmethod,
                                             property))]
        elif isinstance(item, (staticmethod, classmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack += [item.fget, item.fset]
        elif isinstance(item, types.FunctionType):
            codes.add(item.__code__)
        if getattr(item, "__wrapped__", None) is not None:
            stack.append(item.__wrapped__)
    return codes


@contextlib.contextmanager
def calls_watched(places: dict[object, Sequence[str]], hits: list):
    """While the block runs, every call of a function `places` names is appended to `hits`, by what
    it is rather than by the name it is called by: a Python function by its code (whichever
    module, list or closure holds it, or rebuilt from its code), a C function by identity, a
    tensor method by its name on a tensor."""
    codes, c_functions, tensor_methods = {}, {}, set()
    for owner, names in places.items():
        for name in names:
            if not hasattr(owner, name):
                continue
            value, label = getattr(owner, name), f"{getattr(owner, '__name__', owner)}.{name}"
            found = code_objects(value)
            codes.update(dict.fromkeys(found, label))
            if not found:
                c_functions[id(value)] = label
                if owner is torch.Tensor:
                    tensor_methods.add(name)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            hits.append(codes[frame.f_code])
        elif event == "c_call":
            if id(arg) in c_functions:
                hits.append(c_functions[id(arg)])
            elif getattr(arg, "__name__", None) in tensor_methods and isinstance(
                    getattr(arg, "__self__", None), torch.Tensor):
                hits.append(f"Tensor.{arg.__name__}")

    before = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(before)


@contextlib.contextmanager
def switched_off(rule: str, places: dict[object, Sequence[str]], hits: list | None = None):
    """While the block runs, calling any `places` ({module or class: [names]}) fails with `rule`
    (and is appended to `hits`, should the student's code catch the failure).

    How a grader enforces "without X" instead of trusting it: the student's function runs inside
    this block, the grader's own reference computations outside it.
    """
    hits = [] if hits is None else hits

    def forbidden(name: str) -> Callable:
        def refuse(*args, **kwargs):
            hits.append(name)
            raise RuleBroken(f"{rule}: your function called {name}, which this lab switches off")
        return refuse

    with contextlib.ExitStack() as stack:
        for owner, names in places.items():
            for name in names:
                label = f"{getattr(owner, '__name__', owner)}.{name}"
                stack.enter_context(mock.patch.object(owner, name, forbidden(label)))
        yield


def names_in_source(module) -> set[str]:
    """Every name and attribute the module's source mentions, imported names included (`from torch
    import repeat_interleave as r` mentions `repeat_interleave`)."""
    names = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
    return names


def held_anywhere(module, objects: set[int]) -> str | None:
    """The name of a global of `module` that holds one of `objects` (ids): itself, or inside a list,
    tuple, set, dict, class, closure or default argument; or None."""
    def inside(value) -> list:
        if isinstance(value, (list, tuple, set, frozenset)):
            return list(value)
        if isinstance(value, dict):
            return list(value.values())
        if isinstance(value, type):
            return list(vars(value).values())
        if isinstance(value, (staticmethod, classmethod)):
            return [value.__func__]
        if isinstance(value, functools.partial):
            return [value.func, *value.args, *value.keywords.values()]
        if isinstance(value, types.FunctionType):
            cells = [cell.cell_contents for cell in value.__closure__ or () if cell_filled(cell)]
            defaults = list(value.__defaults__ or ()) + list((value.__kwdefaults__ or {}).values())
            return cells + defaults
        return []

    def holds(value, depth: int = 0) -> bool:
        return id(value) in objects or depth < 4 and any(holds(item, depth + 1)
                                                         for item in inside(value))

    return next((key for key, value in vars(module).items() if holds(value)), None)


def cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure's variable not yet assigned
        return False
    return True


@contextlib.contextmanager
def forbidden(lab, rule: str, places: dict[object, Sequence[str]]):
    """`switched_off`, made whole: what a lab forbids is refused however the student's module
    reached it. Before anything runs, the module's source may not name a forbidden function, nor its
    globals hold one (an import by name, an alias, a list or closure that holds it); then, while the
    block runs, every call of one fails, and a call through another name (another module's import
    of it, a copy taken at import, a function rebuilt from its code) is seen by what it runs."""
    names = {name for owner_names in places.values() for name in owner_names}
    objects = {
        id(getattr(owner, name))
        for owner, owner_names in places.items()
        for name in owner_names
        if hasattr(owner, name)
    }
    held = held_anywhere(lab, objects)
    if held:
        raise RuleBroken(f"{rule}: your module holds {held}, which this lab forbids")
    # the lab's own functions may share a forbidden one's name (08_stop_speculating's)
    own = {key for key, value in vars(lab).items()
           if getattr(value, "__module__", None) == lab.__name__}
    named = sorted(names & names_in_source(lab) - own)
    if named:
        raise RuleBroken(f"{rule}: your code uses {named[0]}, which this lab forbids")
    hits: list[str] = []
    try:
        with calls_watched(places, hits), switched_off(rule, places, hits):
            yield
    finally:
        if hits:  # even where the student's code caught the failure, or another error followed
            raise RuleBroken(f"{rule}: your function called {hits[0]}, which this lab switches off")


class DemoPair:
    """The demo target, its drafter and tokenizer from weights/, loaded on first use: a starter that fails
    its first check never pays for them."""

    @functools.cached_property
    def target(self):
        return Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")

    @functools.cached_property
    def drafter(self):
        return Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=self.target)

    @functools.cached_property
    def tokenizer(self):
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
        return [encode_for_generation(problem, self.tokenizer) for problem in self.problems[:count]]

    @functools.cached_property
    def problems(self) -> list:
        return read_prompts(WEIGHTS / "heldout_problems.jsonl")

    @staticmethod
    def generate_dflash(target, drafter, prompt_ids, max_new_tokens: int, **options):
        """The DFlash loop (greedy drafts) a lab runs: `run_dflash`, for the student's code."""
        return run_dflash(target, drafter, prompt_ids, max_new_tokens, **options)

    def drawn_prompt(self, rng: random.Random) -> list[int]:
        """One held-out problem drawn at run time, through the chat template: its ids."""
        return encode_for_generation(rng.choice(self.problems), self.tokenizer)[0]

    @functools.cached_property
    def plain_answers(self) -> list[list[int]]:
        """The unmodified plain loop's tokens on the first held-out prompts: what a plugged-in piece must give."""
        return [generate_autoregressive(self.target, ids, PLAIN_TOKENS, stop_ids=self.stop_ids,
                                        first_token_choices=choices).new_ids
                for ids, choices in self.prompts(PLAIN_PROMPTS)]

    def assert_plugged_in_matches(self, plugged, loop: Callable, what: str) -> None:
        """Under `plugged` (a context manager that swaps the student's piece into the project), `loop(ids, choices,
        max_new_tokens)` (a Generation) must write the unmodified plain loop's tokens, token for token. `what`
        opens the failure message: "01_rmsnorm: with your RMSNorm in every layer"."""
        plain_answers = self.plain_answers  # computed before anything is swapped
        with plugged:
            answers = [loop(ids, choices, PLAIN_TOKENS).new_ids for ids, choices in self.prompts(PLAIN_PROMPTS)]
        for mine, plain in zip(answers, plain_answers):
            first = next((i for i, (a, b) in enumerate(zip(mine, plain)) if a != b), min(len(mine), len(plain)))
            assert mine == plain, (
                f"{what}, the demo pair wrote {self.tokenizer.decode(mine)!r} instead of the plain loop's "
                f"{self.tokenizer.decode(plain)!r} (they part at new token {first})")


class FixturePair:
    """The tests' fixture pair (tests/fixtures: qwen3-tiny-sharded and dflash-tiny), loaded on first
    use: another block size (8), layer count (6), vocabulary (600) and target layer ids than the
    demo pair's, so that an answer that wrote the demo's down fails. Random weights and no
    tokenizer: its prompts are random ids, and it has no stop token."""

    stop_ids: list[int] = []
    tokenizer = None

    @functools.cached_property
    def target(self):
        return Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")

    @functools.cached_property
    def drafter(self):
        return Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=self.target)

    @property
    def block(self) -> int:
        return self.drafter.config.block_size

    def drawn_prompt(self, rng: random.Random) -> list[int]:
        """Random ids, the mask token left out, of a length drawn with `rng`."""
        return [rng.randrange(self.target.config.vocab_size - 1) for _ in range(rng.randint(4, 40))]

    @functools.cache
    def prompts(self, count: int) -> list[tuple[list[int], None]]:
        """`count` random prompts, drawn from the run's seed: (ids, no first-token choices)."""
        rng = drawn_random()
        return [(self.drawn_prompt(rng), None) for _ in range(count)]


@functools.cache
def fixture_pair() -> FixturePair:
    """The one FixturePair of a run: its models load once."""
    return FixturePair()


def run_dflash(target, drafter, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0,
               **options):
    """A DFlash run with greedy drafts, as every grader (and the labs that hand a loop to the
    student) calls it: `generate.generate_dflash`, or in the student copy, where that is the
    capstone's stub, `replayed_dflash`. `options`: stop_ids, runner, block_size,
    first_token_choices, generator, on_token. The one place to change should the loop's
    signature change."""
    try:
        return generate.generate_dflash(target, drafter, prompt_ids, max_new_tokens,
                                        sampling=Sampling(temperature), **options)
    except NotImplementedError as stub:
        if "student copy" not in str(stub):
            raise  # a student's piece, unwritten: not the project's stub
    return replayed_dflash(target, drafter, prompt_ids, max_new_tokens, temperature=temperature,
                           **options)


@torch.no_grad()
def replayed_dflash(target, drafter, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0,
                    stop_ids=(), runner: ModelRunner | None = None, block_size: int | None = None,
                    first_token_choices=None, generator=None, on_token=None):
    """A DFlash run with greedy drafts, read off the plain loop's text instead of run (the method
    of dflash/evaluation.py): the loop commits what the plain loop writes (greedy, the same
    tokens; sampled, the same law, where a one-hot draft is kept when the target's draw equals
    it), so each step drafts from the target's features before the newest committed token and
    keeps the drafts equal to the text's next ones, then the target's own. Drafts go through
    `runner` (a lab's subclass), the features through its prefill."""
    block = block_size or (runner.block_size if runner is not None else default_block_size(drafter))
    runner = runner or ModelRunner(target, drafter, block_size=block, max_length=cache_slots(
        len(prompt_ids), max_new_tokens, block))
    said = generate_autoregressive(target, prompt_ids, max_new_tokens + block - 1,
                                   sampling=Sampling(temperature), generator=generator,
                                   first_token_choices=first_token_choices).new_ids
    _, features = runner.prefill(list(prompt_ids) + said[:max_new_tokens], Sampling(), None)
    output = GenerationBuilder(max_new_tokens, stop_ids, on_token, features.device)
    output.commit(said[:1], step=False)
    committed = 1  # the prefill's token
    while not output.done:
        anchor = len(prompt_ids) + committed - 1  # where the newest committed token goes
        runner.target_cache.trim(0)  # the tokens committed by then (the prefill wrote their
        runner.target_cache.commit(anchor)  # keys): the draft's block opens after them
        runner.drafter_cache.trim(0)  # the drafter reads the whole context afresh
        drafts = argmax(runner.draft(features[:, :anchor], said[committed - 1])).tolist()
        ahead = said[committed:]
        accepted = next((k for k, (draft, token) in enumerate(zip(drafts, ahead))
                         if draft != token), len(drafts))
        output.commit(ahead[:accepted + 1], drafted=accepted)  # the drafts, the target's own
        committed += accepted + 1
    return output.result


def dflash_loop(demo: DemoPair) -> Callable:
    """The chain loop on the demo pair, as `DemoPair.assert_plugged_in_matches` calls it."""
    return lambda ids, choices, limit: run_dflash(demo.target, demo.drafter, ids, limit,
                                                  stop_ids=demo.stop_ids,
                                                  first_token_choices=choices)


def plain_loop(demo: DemoPair) -> Callable:
    """The plain loop on the demo pair, as `DemoPair.assert_plugged_in_matches` calls it: where a
    lab's piece lives in the target, it is what the target writes (the DFlash loop writes the
    same, and in the student copy it is the capstone's answer)."""
    return lambda ids, choices, limit: generate_autoregressive(demo.target, ids, limit,
                                                               stop_ids=demo.stop_ids,
                                                               first_token_choices=choices)


def assert_tree_verified_alike(demo: DemoPair, plugged, what: str, budget: int = 16,
                               prompts: int = 2, offsets: Sequence[int] = (0, 9, 23)) -> None:
    """Under `plugged` (a context manager that swaps the student's piece into the tree's verify
    pass), the target's token after every node of real draft trees (after `draft_contexts`, built
    best first with `budget` nodes) must be the one it picks with the project's own pieces.
    `what` opens the failure message."""
    for step, (context, choices) in enumerate(draft_contexts(demo, prompts, offsets)):
        runner = ModelRunner(demo.target, demo.drafter, tree_budget=budget,
                             max_length=len(context) + budget + 1 + demo.block)
        root, features = runner.prefill(torch.tensor([context]), Sampling(), None, choices)
        logprobs, candidates = runner.draft_tree(features, root)  # (block - 1, budget) each
        tree = build_tree(root, logprobs.tolist(), candidates.tolist(), budget)
        right = runner.verify_tree(tree, Sampling(), None)[:len(tree.tokens)].tolist()
        with plugged:
            mine = runner.verify_tree(tree, Sampling(), None)[:len(tree.tokens)].tolist()
        wrong = next((node for node, (a, b) in enumerate(zip(mine, right)) if a != b), None)
        assert wrong is None, (
            f"{what}, the target picks another token after node {wrong} of a {len(tree.tokens)}-"
            f"node draft tree (draft step {step}) than with the project's own")


# ------------------------------------------------------------------ what some labs hand the student


def qwen3_8b_counts(context: int = 2048):
    """Notebook 2's roofline counts for one Qwen3-8B pass over `tokens` new tokens after `context` cached ones,
    in bfloat16: `bytes_read(tokens)` (every weight once, the embedding rows used, the whole KV cache) and
    `flops(tokens)` (2 per weight and token, plus attention's scores and sums)."""
    config = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen3(config)
    total = sum(p.numel() for p in model.parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # LM head included
    other = total - matmul - model.embed_tokens.weight.numel()  # the norms
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim  # keys + values

    def bytes_read(tokens: int) -> float:
        weights = matmul + other + tokens * config.hidden_size
        return 2 * (weights + kv_per_token * (context + tokens))

    def flops(tokens: int) -> float:
        keys_seen = tokens * context + tokens * (tokens + 1) / 2  # cached keys, then causal within the new tokens
        attention = 4 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * keys_seen
        return 2 * matmul * tokens + attention

    return types.SimpleNamespace(bytes_read=bytes_read, flops=flops, context=context)


def tiny_experiment(seed: int = 0):
    """Notebook 2's section 4 (its target drawn with `seed`; the notebook's is 0): a tiny target
    over 8 tokens, a stand-in drafter, the DFlash loop to run (`generate_dflash`: `run_dflash`), and
    `GreedyGuessRunner`, whose drafts are the target's greedy continuation of the committed text
    (`committed`, kept up to date by the loop's `on_token`). `next_probabilities(prefixes)` gives
    the target's exact next-token law after PROMPT + each prefix."""
    vocab, prompt, temperature = 8, [1, 5, 2, 6], 1.0
    small = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(seed)
    target = Qwen3(small).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4)  # sharper distributions, as in the notebook
    drafter = Drafter(DrafterConfig(layers=Qwen3Config(**{**vars(small), "num_hidden_layers": 1}), block_size=4,
                                    num_target_layers=2, mask_token_id=0, target_layer_ids=[0, 1])).eval()

    @functools.cache
    @torch.no_grad()
    def greedy_next(prefix: tuple) -> int:
        hidden, _ = target(torch.tensor([prefix]))  # (1, len, hidden)
        return target.logits(hidden[0, -1]).argmax().item()

    class GreedyGuessRunner(ModelRunner):
        """Drafts the target's greedy continuation of the committed text (the drafter pass still runs)."""

        def __init__(self, *args, **kwargs):
            self.committed = []  # the text so far, kept up to date by the loop's `on_token`
            super().__init__(*args, **kwargs)

        def draft(self, features, last_token):
            logits = super().draft(features, last_token)  # (block - 1, vocab): the real pass runs
            guess = list(self.committed)
            for _ in range(self.block_size - 1):
                guess.append(greedy_next(tuple(guess)))
            return certain_logits(torch.tensor(guess[len(self.committed):]), logits.shape[-1])

    @torch.no_grad()
    def next_probabilities(prefixes):
        ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])  # (prefixes, len)
        hidden, _ = target(ids)  # (prefixes, len, hidden)
        return torch.softmax(target.logits(hidden[:, -1]).double() / temperature, dim=-1)  # (prefixes, vocab)

    return types.SimpleNamespace(target=target, drafter=drafter, vocab=vocab, prompt=prompt, temperature=temperature,
                                 GreedyGuessRunner=GreedyGuessRunner,
                                 next_probabilities=next_probabilities,
                                 generate_dflash=DemoPair.generate_dflash)


class WatchedPooledTau:
    """`pooled_tau(runner_class)` as notebook 3 hands it to the student: tau pooled over the steps of
    generate_dflash on the first held-out prompts, each run with a fresh `runner_class` runner. It also
    records, per call, which feature columns the drafter's passes ever saw nonzero (`seen[i]`, (F,) bools),
    and the tau it returned (`taus[i]`): the grader checks the student's runner did what the lab asks."""

    def __init__(self, demo: DemoPair, prompts: int = 4, max_new_tokens: int = 64):
        self.demo, self.count, self.max_new_tokens = demo, prompts, max_new_tokens
        self.seen: list[torch.Tensor] = []
        self.taus: list[float] = []

    def __call__(self, runner_class) -> float:
        demo, lengths = self.demo, []
        seen = torch.zeros(len(demo.drafter.config.target_layer_ids) * demo.target.config.hidden_size, dtype=torch.bool)
        draft_pass = generate.PASSES["draft"]

        def watched(target, drafter, cache, features, *args, **kwargs):
            seen.logical_or_(features.ne(0).flatten(0, -2).any(0))  # (F,): columns seen nonzero
            return draft_pass(target, drafter, cache, features, *args, **kwargs)

        with mock.patch.dict(generate.PASSES, draft=watched):
            for ids, choices in demo.prompts(self.count):
                runner = runner_class(demo.target, demo.drafter, max_length=len(ids) + self.max_new_tokens + demo.block)
                lengths += run_dflash(demo.target, demo.drafter, ids, self.max_new_tokens,
                                      stop_ids=demo.stop_ids, runner=runner,
                                      first_token_choices=choices).acceptance_lengths
        self.seen.append(seen)
        self.taus.append(sum(lengths) / len(lengths))
        return self.taus[-1]


def draft_contexts(demo: DemoPair, prompts: int, offsets: Sequence[int]) -> list[tuple]:
    """(context ids, first-token choices or None) after each of the first `prompts` held-out
    prompts plus the first `offsets` tokens of the target's greedy answer: where real steps
    draft."""
    contexts = []
    for ids, choices in demo.prompts(prompts):
        truth = generate_autoregressive(demo.target, ids, max(offsets), first_token_choices=choices).new_ids
        contexts += [(ids + truth[:offset], choices if offset == 0 else None) for offset in offsets]
    return contexts


def draft_steps(demo: DemoPair, prompts: int, offsets: Sequence[int],
                top_k: int = 32) -> list[tuple]:
    """Tree draft passes of the demo pair inside real answers (`draft_contexts`): (root, logprobs,
    candidates) per step, as lists ((block - 1, top_k) each, likeliest first)."""
    steps = []
    for context, choices in draft_contexts(demo, prompts, offsets):
        runner = ModelRunner(demo.target, demo.drafter, tree_budget=top_k,
                             max_length=len(context) + top_k + 1 + demo.block)
        root, features = runner.prefill(torch.tensor([context]), 0.0, None, choices)
        logprobs, candidates = runner.draft_tree(features, root)  # (block - 1, top_k) each
        steps.append((root, logprobs.tolist(), candidates.tolist()))
    return steps


def random_step(generator: torch.Generator, depth: int, width: int, vocab: int = 1000) -> tuple:
    """A made-up draft step: (root, logprobs, candidates), each slot's `width` candidates distinct and likeliest
    first, as a drafter's top-k; for checks that need no model."""
    logprobs = torch.randn(depth, vocab, generator=generator).mul(3).log_softmax(-1).topk(width, dim=-1)
    return int(torch.randint(vocab, (1,), generator=generator)), logprobs.values.tolist(), logprobs.indices.tolist()


def qwen3_8b_pass_costs():
    """Notebook 8's section 5, as its costs: `target` and `drafter` (teaching.PassCost of Qwen3-8B
    and its 5-layer DFlash drafter, which borrows the target's LM head), and the GPUs `H100` and
    `H200`."""
    big = Qwen3Config()  # Qwen3-8B
    with torch.device("meta"):  # shapes only, no memory
        target = Qwen3(big)
        drafter = Drafter(
            DrafterConfig(
                Qwen3Config(num_hidden_layers=5),
                block_size=16,
                num_target_layers=36,
                mask_token_id=big.vocab_size,
                target_layer_ids=default_target_layer_ids(36, 5),
            )
        )
    return types.SimpleNamespace(
        target=teaching.PassCost.of(target, big),
        H100=teaching.H100,
        H200=teaching.H200,
        drafter=teaching.PassCost.of(
            drafter, drafter.config.layers, borrowed_matmul=target.lm_head.weight.numel()
        ),
    )


def gpu_speedup_model():
    """Notebook 8's section 5: `gpu_speedup(gpu, alpha, block)`, the speedup the roofline model predicts for DFlash
    on "H100 SXM" or "H200" (Qwen3-8B and a 5-layer drafter of its width, bfloat16, 1,024 cached tokens), with a
    constant per-slot acceptance alpha. A model, not a measurement: a pass takes the longer of its bytes over
    the bandwidth and its FLOPs over the peak rate."""
    gpus = {"H100 SXM": dict(bandwidth=3.35e12, flops=989e12), "H200": dict(bandwidth=4.8e12, flops=989e12)}
    context, big = 1024, Qwen3Config()  # Qwen3-8B
    with torch.device("meta"):
        target = Qwen3(big)
        drafter = Drafter(DrafterConfig(Qwen3Config(num_hidden_layers=5), block_size=16, num_target_layers=36,
                                        mask_token_id=big.vocab_size, target_layer_ids=default_target_layer_ids(36, 5)))

    def matmul_weights(module) -> int:
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))

    models = {"target": (matmul_weights(target), 36),  # (weights read, layers with a KV cache)
              "drafter": (matmul_weights(drafter) + target.lm_head.weight.numel(), 5)}

    def pass_ms(gpu: str, model: str, tokens: int) -> float:
        weights, kv_layers = models[model]
        kv_per_token = 2 * kv_layers * big.num_key_value_heads * big.head_dim
        bytes_read = 2 * (weights + kv_per_token * (context + tokens))
        keys_seen = tokens * context + tokens * (tokens + 1) / 2
        flops = 2 * weights * tokens + 4 * kv_layers * big.num_attention_heads * big.head_dim * keys_seen
        return 1e3 * max(bytes_read / gpus[gpu]["bandwidth"], flops / gpus[gpu]["flops"])

    @functools.cache
    def gpu_speedup(gpu: str, alpha: float, block: int) -> float:
        tau = sum(alpha ** k for k in range(block))  # expected tokens per step: slot k is reached w.p. alpha^k
        step = pass_ms(gpu, "drafter", 2 * block) + pass_ms(gpu, "target", block)  # draft, then verify
        return tau / (step / pass_ms(gpu, "target", 1))  # against the plain loop's one token per decode pass

    return gpu_speedup
