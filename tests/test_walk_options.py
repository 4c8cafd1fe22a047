"""Every option of every program, and every field of the three config files, given hostile values.

A case passes when the program exits 0, or exits 2 with exactly one `error:` line, within
CASE_SECONDS: never a traceback, never a hang, never a second line. The options are read from each
program's own `build_parser()`, so an option added later is walked without a word here; a new
program goes into PROGRAMS (`test_every_program_is_walked` says so). The config fields are the
fixtures' own and every field the readers check (`QWEN3_FIELD_RULES`, `DRAFTER_FIELD_RULES`,
`GENERATION_FIELD_RULES`), read by generate.py.

The programs run in this process (`main(argv)`, stdout and stderr captured): a subprocess each would
spend its time importing torch. Cases that fail in code another branch owns are in PENDING with what
they did: skipped, not hidden; whoever fixes that code empties the list.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from dflash.checkpoint import DRAFTER_FIELD_RULES, QWEN3_FIELD_RULES
from dflash.sampling import GENERATION_FIELD_RULES

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FIXTURES, WEIGHTS = ROOT / "tests" / "fixtures", ROOT / "weights"
CASE_SECONDS = 30  # a valid run here takes under a second; a hang or a runaway allocation won't

# Each option taking a value gets these, by what it takes: a number (or a list of them): empty,
# the wrong type, out of range, not a number, extreme; a path or a text: empty, missing, a device;
# one of some choices: empty, none of them.
NUMBER_VALUES = ["", "abc", "-1", "0", "nan", "1e308", "1180591620717411303424"]
TEXT_VALUES = ["", "abc", "/dev/null"]
CHOICE_VALUES = ["", "bogus"]
# Each config field gets every one of these: the wrong types, out of range, and huge (past a float).
FIELD_VALUES = ["x", -1, 0, 10**12, 10**400, 1e308, None, True, [1], {}]  # 10**400: no float


@dataclass
class Program:
    """A program's module (tests/conftest.py puts benchmarks/ on the path) and the argv of a tiny
    valid run writing in `folder`."""

    module: str
    base: Callable[[Path], list[str]]
    parse_only: bool = False  # only its parser is walked: a valid run is too long for the suite

    def main(self):
        return importlib.import_module(self.module).main

    def parser(self) -> argparse.ArgumentParser:
        return importlib.import_module(self.module).build_parser()


def prompts_file(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text('{"prompt_ids": [5, 6, 7]}\n')
    return path


def text_prompts_file(folder: Path) -> Path:
    path = folder / "text_prompts.jsonl"
    path.write_text('{"prompt": "Mia has 3 apples."}\n')
    return path


def train_data(folder: Path) -> Path:
    path = folder / "data.jsonl"
    ids = [(7 * i) % 500 + 1 for i in range(16)]
    path.write_text(json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * 12}) + "\n")
    return path


PAIR = ["--model", str(FIXTURES / "qwen3-tiny-sharded"), "--draft", str(FIXTURES / "dflash-tiny")]
DEMO = ["--model", str(WEIGHTS / "tiny-qwen3"), "--draft", str(WEIGHTS / "tiny-qwen3-dflash")]

PROGRAMS = {
    "generate.py": Program("generate", lambda folder: [
        *PAIR, "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--device", "cpu"]),
    "train.py": Program("train", lambda folder: [  # --minutes: a huge --steps is a long run, no bug
        "--target", str(FIXTURES / "qwen3-tiny"), "--data", str(train_data(folder)),
        "--out", str(folder / "run"), "--drafter-layers", "1", "--block-size", "4",
        "--num-anchors", "2", "--batch-size", "1", "--steps", "1", "--max-seq-len", "16",
        "--save-every-minutes", "0", "--minutes", "0.005", "--device", "cpu"]),
    "make_data.py": Program("make_data", lambda folder: [
        "--target", str(WEIGHTS / "tiny-qwen3"), "--prompts", str(text_prompts_file(folder)),
        "--out", str(folder / "data.jsonl"), "--max-new-tokens", "3", "--device", "cpu"]),
    "benchmarks/bench.py": Program("bench", lambda folder: [
        *DEMO, "--prompts", str(prompts_file(folder)), "--max-new-tokens", "3",
        "--block-sizes", "4", "--no-oracle", "--device", "cpu"]),
    "benchmarks/drafter_check.py": Program("drafter_check", lambda folder: [
        *DEMO, "--prompts", str(prompts_file(folder)), "--max-new-tokens", "3", "--device", "cpu"]),
}
if (ROOT / "benchmarks" / "cpu_study.py").exists():  # it times real Qwen3 shapes: its parser only
    PROGRAMS["benchmarks/cpu_study.py"] = Program("cpu_study", lambda folder: [], parse_only=True)
# Measurements of minutes (sweeps, compiled runs, busy cores): their parsers only.
for name in ("block_sweep", "verify_what_pays", "busy_neighbour"):
    PROGRAMS[f"benchmarks/{name}.py"] = Program(name, lambda folder: [], parse_only=True)
# Scripts with a parser that measure rather than serve a user: not walked.
NOT_WALKED = {"benchmarks/bench_load.py", "benchmarks/bench_train.py", "benchmarks/gpu_check.py",
              "benchmarks/pass_costs.py", "benchmarks/step_overheads.py"}

# (program, option, value) -> what it did when this was written; the code that fails is another
# branch's (generate.py: the lead's; train.py: the train branch's).
HUGE = "1180591620717411303424"
PENDING: dict[tuple[str, str, str], str] = {}
# Options whose valid run takes minutes here (compiling on a CPU): only their parser is walked.
SLOW = {("generate.py", "--compile"), ("benchmarks/bench.py", "--compile")}


# ------------------------------------------------------------------ running one case


class Hang(BaseException):
    """Raised in a run that went on too long: not an OSError (TimeoutError is one, and the
    programs turn those into a refusal) nor an Exception that code under test could catch."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """A `Hang` inside the block once it runs past `seconds`, where a hang would stop the suite
    (SIGALRM: Unix, main thread; a call stuck in native code does not see it)."""
    def late(signum, frame):
        raise Hang(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(main, argv: list[str]) -> str | None:
    """None when `main(argv)` keeps the promise (exit 0; or exit 2 and one `error:` line), else
    what it did instead."""
    err, began = io.StringIO(), time.perf_counter()
    quiet = contextlib.redirect_stdout(io.StringIO())
    try:
        with quiet, contextlib.redirect_stderr(err), time_limit(CASE_SECONDS):
            try:
                status = main(argv)
            except SystemExit as exit:
                status = exit.code
    except BaseException as error:  # noqa: BLE001: a traceback is what we look for
        frame = traceback.extract_tb(error.__traceback__)[-1]
        first_line = (str(error).splitlines() or [""])[0][:160]
        return f"{type(error).__name__} at {Path(frame.filename).name}:{frame.lineno}: {first_line}"
    lines = err.getvalue().strip().splitlines()
    if "Traceback" in err.getvalue():
        return f"a traceback on stderr (exit {status}): {lines[-1][:160]}"
    if status == 2 and (len(lines) != 1 or not lines[0].startswith("error: ")):
        return f"exit 2 with {len(lines)} stderr lines: {' | '.join(lines)[:200]}"
    if status not in (0, 2):
        return f"exit {status}: {' | '.join(lines[-2:])[:200]}"
    if time.perf_counter() - began > CASE_SECONDS:  # the alarm came while in native code
        return f"took {time.perf_counter() - began:.0f} s"
    return None


# ------------------------------------------------------------------ the options


def option_cases() -> list[tuple[str, str, str | None]]:
    """(program, option, value; None: a flag) for every option of every program, --help aside."""
    cases = []
    for name, program in PROGRAMS.items():
        for action in program.parser()._actions:
            options = [option for option in action.option_strings if option.startswith("--")]
            if not options or isinstance(action, argparse._HelpAction):
                continue
            if action.nargs == 0:
                cases.append((name, options[0], None))
                continue
            text = action.type in (None, str, Path)
            values = CHOICE_VALUES if action.choices else TEXT_VALUES if text else NUMBER_VALUES
            cases += [(name, options[0], value) for value in values]
            if action.nargs == "?":
                cases.append((name, options[0], None))
    return cases


def test_every_program_is_walked():
    """Every script with a `build_parser` and a `main` is in PROGRAMS, or in NOT_WALKED."""
    scripts = [path for folder in (ROOT, ROOT / "benchmarks") for path in folder.glob("*.py")]
    found = {str(path.relative_to(ROOT)) for path in scripts
             if "def build_parser(" in path.read_text() and "def main(" in path.read_text()}
    assert found - NOT_WALKED <= set(PROGRAMS), found - NOT_WALKED - set(PROGRAMS)


def run_option_case(program: str, option: str, value: str | None, folder: Path) -> str | None:
    spec = PROGRAMS[program]
    given = [option] if value is None else [f"{option}={value}"]  # "--seed=-1": -1 is the value
    if spec.parse_only or (program, option) in SLOW:
        parser = spec.parser()
        return outcome(lambda argv: parser.parse_args(argv) and 0, given)
    return outcome(spec.main(), spec.base(folder) + given)


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_every_option_takes_hostile_values_in_one_line(program, tmp_path):
    """Each option alone, after a tiny valid run's arguments, with each value its kind gets (a flag:
    given)."""
    failures = []
    for index, (name, option, value) in enumerate(option_cases()):
        if name != program or (name, option, str(value)) in PENDING:
            continue
        folder = tmp_path / str(index)
        folder.mkdir()
        with contextlib.chdir(folder):  # what a case writes by default lands here
            found = run_option_case(name, option, value, folder)
        if found is not None:
            failures.append(f"{name} {option} {value!r}: {found}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ the config fields


def linked_copy(source: Path, folder: Path, config: str, edit: Callable[[dict], None]) -> Path:
    """`source` in `folder`, every file a link but `config`, whose JSON object `edit` changes."""
    folder.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != config:
            (folder / path.name).symlink_to(path)
    data = json.loads((source / config).read_text()) if (source / config).exists() else {}
    edit(data)
    (folder / config).write_text(json.dumps(data))
    return folder


def set_field(name: str, value) -> Callable[[dict], None]:
    """An edit setting a field; "a.b" is field b of the object a (made if missing)."""
    def edit(data: dict) -> None:
        outer, _, inner = name.rpartition(".")
        place = data.setdefault(outer, {}) if outer else data
        if isinstance(place, dict):
            place[inner] = value
    return edit


def config_fields(source: Path, config: str, rules: dict) -> list[str]:
    data = json.loads((source / config).read_text()) if (source / config).exists() else {}
    nested = [f"{outer}.{inner}" for outer, value in data.items() if isinstance(value, dict)
              for inner in value]
    return list(dict.fromkeys([*data, *nested, *rules]))


# (file, the fixture it edits, the rules its reader checks, the models given to generate.py)
CONFIGS = {
    "target config.json": ("config.json", FIXTURES / "qwen3-tiny-sharded", QWEN3_FIELD_RULES,
                           lambda folder: ["--model", str(folder), *PAIR[2:]]),
    "drafter config.json": ("config.json", FIXTURES / "dflash-tiny", DRAFTER_FIELD_RULES,
                            lambda folder: [*PAIR[:2], "--draft", str(folder)]),
    "generation_config.json": (
        "generation_config.json", WEIGHTS / "tiny-qwen3", GENERATION_FIELD_RULES,
        lambda folder: ["--model", str(folder), *DEMO[2:], "--sample-from-config"]),
    "tokenizer_config.json": ("tokenizer_config.json", WEIGHTS / "tiny-qwen3", {},
                              lambda folder: ["--model", str(folder), *DEMO[2:]]),
}


def generate_with(which: str, folder: Path) -> str | None:
    """generate.py's outcome on the checkpoint copy `folder` of CONFIGS[which]'s fixture."""
    _, source, _, models = CONFIGS[which]
    has_tokenizer = (source / "tokenizer.json").exists()
    prompt = ["--prompt", "Mia has 3 apples."] if has_tokenizer else ["--prompt-ids", "5,6,7"]
    main = importlib.import_module("generate").main
    return outcome(main, [*models(folder), *prompt, "--max-new-tokens", "3", "--device", "cpu"])


@pytest.mark.parametrize("which", list(CONFIGS))
def test_every_config_field_takes_hostile_values_in_one_line(which, tmp_path):
    """Each field of the file alone, set to each of FIELD_VALUES."""
    config, source, rules, _ = CONFIGS[which]
    failures = []
    for field in config_fields(source, config, rules):
        for index, value in enumerate(FIELD_VALUES):
            edit = set_field(field, value)
            folder = linked_copy(source, tmp_path / f"{field}-{index}", config, edit)
            found = generate_with(which, folder)
            if found is not None:
                failures.append(f"{which} {field} = {json.dumps(value)}: {found}")
    assert not failures, "\n".join(failures)


def test_a_config_file_that_is_not_an_object_is_one_line(tmp_path):
    failures = []
    for which, (config, source, _, _) in CONFIGS.items():
        for index, text in enumerate(["[1, 2]", "7", '"x"', "null", "{", ""]):
            folder = linked_copy(source, tmp_path / f"{which}-{index}", config, lambda data: None)
            (folder / config).write_text(text)
            found = generate_with(which, folder)
            if found is not None:
                failures.append(f"{which} holding {text!r}: {found}")
    assert not failures, "\n".join(failures)
