"""The benchmarks', the block-size cache's and the tutorials' tools, tried as a hostile user would
(issue #50): a side file of the wrong shape counts as absent with one note; an output over an
input, a number past what the machine has, a bad destination, a stray option or Ctrl-C is one
`error:` line (exit 2, or 130), and nothing the run reads or writes is touched or left half done.

The programs run in this process; what would take long (loading, measuring) is replaced by a
call that fails the test, so a refusal that comes too late shows as that failure."""

import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

import bench
import bench_common
import block_sweep
import cpu_study
import drafter_check
import make_data
import pass_costs
from dflash import block_choice, checkpoint
from dflash.cli import UsageError, refuse_overlap
from tests.snapshots import assert_untouched, tree_bytes
from tests.test_walk_options import FIELD_VALUES

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny"
BLOCKS = [2, 4]
DEEP = "[" * 100_000 + "]" * 100_000  # RecursionError in Python's parser, unchecked


def tool(name: str):
    """A tutorials/ script as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tutorials" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcome(main, argv, capsys) -> tuple[int, list[str]]:
    """`main(argv)`'s status and its standard error's lines."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err.strip().splitlines()


def refused(main, argv, capsys, *fragments, status: int = 2) -> str:
    """`main(argv)` exits `status` with one `error:` line holding every fragment; the line."""
    got, lines = outcome(main, argv, capsys)
    errors = [line for line in lines if line.startswith("error: ")]
    assert got == status and len(errors) == 1 and "Traceback" not in "\n".join(lines), lines
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or measuring anything fails the test: a refusal must come first."""
    def started(*args, **kwargs):
        raise AssertionError("the work started before the input was refused")

    for module, name in ((bench, "benchmark"), (drafter_check, "check_drafter"),
                         (cpu_study, "study"), (pass_costs, "measure")):
        monkeypatch.setattr(module, name, started)
    for module in (bench, drafter_check):
        monkeypatch.setattr(module.Qwen3, "from_pretrained", started)


def prompts(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text('{"prompt_ids": [5, 6, 7]}\n')
    return path


# ------------------------------------------------------------------ the calibration cache


def costs(value: float = 1.0) -> dict:
    """Pass costs as `calibrate` keeps them (block keys as text, as in the file)."""
    line = {"overhead": value, "per_token": 0.0}
    timed = {str(n): value for n in BLOCKS}
    return {"blocks": BLOCKS, "draft_ms": timed, "verify_ms": dict(timed), "draft_fit_ms": line,
            "verify_fit_ms": dict(line)}


def with_field(name: str, value) -> dict:
    kept = costs()
    kept[name] = value
    return kept


def with_timed(value) -> dict:
    kept = costs()
    kept["verify_ms"]["4"] = value
    return kept


BAD_CACHES = {
    "not UTF-8": b"\xff\xfe{}",
    "not JSON": b"{not json",
    "a list": b"[1, 2]",
    "deep": DEEP.encode(),
    "a duplicate key": b'{"key": 1, "key": 2}',
    "the entry a list": json.dumps({"key": [1]}).encode(),
    "no blocks": json.dumps({"key": {k: v for k, v in costs().items() if k != "blocks"}}).encode(),
    "other blocks": json.dumps({"key": with_field("blocks", [2, 8])}).encode(),
    "empty timings": json.dumps({"key": with_field("verify_ms", {})}).encode(),
    "a text cost": json.dumps({"key": with_timed("1.5")}).encode(),
    "a zero cost": json.dumps({"key": with_timed(0)}).encode(),
    "a negative cost": json.dumps({"key": with_timed(-3)}).encode(),
    "a NaN cost": json.dumps({"key": with_timed(float("nan"))}).encode(),
    "an infinite cost": json.dumps({"key": with_timed(float("inf"))}).encode(),
    "a boolean cost": json.dumps({"key": with_timed(True)}).encode(),
    "a 400-digit cost": json.dumps({"key": with_timed(10**400)}).encode(),
    "a fit line of text": json.dumps({"key": with_field("draft_fit_ms", "fast")}).encode(),
    "a NaN fit": json.dumps({"key": with_field("verify_fit_ms", {
        "overhead": float("nan"), "per_token": 1.0})}).encode(),
}


@pytest.mark.parametrize("content", BAD_CACHES.values(), ids=BAD_CACHES.keys())
def test_a_bad_calibration_cache_is_measured_over_with_one_note(content, tmp_path, monkeypatch,
                                                                capsys):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    block_choice.cache_file().write_bytes(content)
    measured = costs(2.0)
    assert block_choice.cached_calibration("key", lambda: measured, BLOCKS) == (measured, True)
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: ") and "ignored" in notes[0], notes
    kept = json.loads(block_choice.cache_file().read_text())  # measured over, and kept whole
    assert block_choice.cache_problem(kept, "key", BLOCKS) is None
    assert block_choice.cached_calibration("key", pytest.fail, BLOCKS)[1] is False


@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
def test_a_calibration_cache_that_is_no_file_is_neither_read_nor_replaced(kind, tmp_path,
                                                                        monkeypatch, capsys):
    """A FIFO would block the reader for ever; neither it nor a folder is ours to replace."""
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    path = block_choice.cache_file()
    os.mkfifo(path) if kind == "a FIFO" else path.mkdir()
    assert block_choice.cached_calibration("key", lambda: costs(), BLOCKS) == (costs(), True)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not path.is_file() and path.exists()


def test_a_good_cache_is_read_without_a_word(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    block_choice.cache_file().write_text(json.dumps({"key": costs(), "other": "not ours"}))
    assert block_choice.cached_calibration("key", pytest.fail, BLOCKS) == (costs(), False)
    assert capsys.readouterr().err == ""


def test_auto_never_predicts_nan_from_a_poisoned_cache(tmp_path, monkeypatch, capsys):
    """The cache holds NaN costs under the very key generate.py asks for: measured over, and the
    choice line names a real prediction (it once said "predicted nanx", block 2)."""
    import generate
    from test_cli import PAIR, PROMPT_IDS

    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    argv = ["--prompt-ids", PROMPT_IDS, *PAIR, "--max-new-tokens", "8", "--block-size", "auto",
            "--threads", "1"]
    assert generate.main(argv) == 0
    kept = json.loads(block_choice.cache_file().read_text())
    (key,) = kept
    kept[key]["verify_ms"] = {n: float("nan") for n in kept[key]["verify_ms"]}
    block_choice.cache_file().write_text(json.dumps(kept))
    capsys.readouterr()
    assert generate.main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"predicted \d+\.\d+x", err) and "calibrated now" in err, err
    assert err.count("note: ") == 1


@pytest.mark.parametrize("field", ["blocks", "draft_ms", "verify_ms", "draft_fit_ms",
                                   "verify_fit_ms", "a timed pass", "a fit's overhead"])
def test_every_cache_field_walked_with_hostile_values(field, tmp_path, monkeypatch, capsys):
    """test_walk_options' FIELD_VALUES in every field the choice reads: each measured over."""
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    for value in FIELD_VALUES:
        kept = costs()
        if field == "a timed pass":
            kept["draft_ms"]["2"] = value
        elif field == "a fit's overhead":
            kept["verify_fit_ms"]["overhead"] = value
        else:
            kept[field] = value
        block_choice.cache_file().write_text(json.dumps({"key": kept}))
        capsys.readouterr()
        fitted = field == "a fit's overhead" and not isinstance(value, bool) and value in (-1, 0)
        if fitted:  # a line fitted through the timings may cross 0 before the first block
            assert block_choice.cached_calibration("key", pytest.fail, BLOCKS)[1] is False
            continue
        assert block_choice.cached_calibration("key", lambda: costs(3.0), BLOCKS) == (
            costs(3.0), True), value
        assert capsys.readouterr().err.count("note: ") == 1, value


# ------------------------------------------------------------------ a drafter's training log

GOOD = {"step": 10, "slot_accuracy": [0.9, 0.5], "tau_estimate": 2.1}
BAD_LOGS = {
    "not UTF-8": b"\xff\xfe\n",
    "a line not JSON": b'{"step": 1}\n{oops}\n' + json.dumps(GOOD).encode() + b"\n",
    "a line a list": b"[1, 2]\n",
    "deep": DEEP.encode() + b"\n",
    "a duplicate key": b'{"step": 1, "step": 2}\n',
    "rates of text": json.dumps({**GOOD, "slot_accuracy": ["0.9", "0.5"]}).encode() + b"\n",
    "a NaN rate": json.dumps({**GOOD, "slot_accuracy": [float("nan"), 0.5]}).encode() + b"\n",
    "a rate of 2": json.dumps({**GOOD, "heldout_slot_accuracy": [2, 0.5]}).encode() + b"\n",
    "no rates": json.dumps({**GOOD, "slot_accuracy": []}).encode() + b"\n",
    "rates a number": json.dumps({**GOOD, "slot_accuracy": 0.9}).encode() + b"\n",
}
# Wrong only in what drafter_check reports (block_choice reads the rates alone, and takes them).
BAD_CLAIMS = {
    "a text step": {**GOOD, "step": "ten"},
    "no step": {"slot_accuracy": [0.9, 0.5]},
    "an infinite tau": {**GOOD, "tau_estimate": float("inf")},
    "a 400-digit tau": {**GOOD, "eval_tau": 10**400},
    "engine-style rates of text": {**GOOD, "eval_slot_acceptance": ["high"]},
}


@pytest.mark.parametrize("content", BAD_LOGS.values(), ids=BAD_LOGS.keys())
def test_a_bad_training_log_counts_as_absent_with_one_note(content, tmp_path, capsys):
    """Both readers, block_choice's and drafter_check's: None, one note each, no traceback."""
    (tmp_path / "train_log.jsonl").write_bytes(content)
    assert block_choice.logged_acceptance(tmp_path) is None
    assert drafter_check.training_log_claim(tmp_path) is None
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 2 and all(n.startswith("note: ") for n in notes), notes


@pytest.mark.parametrize("record", BAD_CLAIMS.values(), ids=BAD_CLAIMS.keys())
def test_a_log_drafter_check_cannot_report_from_is_one_note(record, tmp_path, capsys):
    (tmp_path / "train_log.jsonl").write_text(json.dumps(record) + "\n")
    assert block_choice.logged_acceptance(tmp_path) == [0.9, 0.5]
    assert drafter_check.training_log_claim(tmp_path) is None
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: "), notes


@pytest.mark.parametrize("field", list(drafter_check.LOG_FIELD_RULES))
def test_every_log_field_walked_with_hostile_values(field, tmp_path, capsys):
    """FIELD_VALUES in every figure the two readers take from a log: never a traceback, at most
    a note each, and rates only in 0..1 when read."""
    for value in FIELD_VALUES:
        (tmp_path / "train_log.jsonl").write_text(json.dumps({**GOOD, field: value}) + "\n")
        capsys.readouterr()
        rates = block_choice.logged_acceptance(tmp_path)
        claim = drafter_check.training_log_claim(tmp_path)
        notes = capsys.readouterr().err.strip().splitlines()
        assert len(notes) <= 2 and all(note.startswith("note: ") for note in notes), notes
        assert rates is None or all(0 <= rate <= 1 for rate in rates), value
        if claim is not None:
            drafter_check.print_report(drafter_check.Report(
                1.0, [None], claim, {"as configured": drafter_check.Score(1.0, [0.5], 1.0)},
                "as configured", "fine"))


def test_a_log_cut_mid_line_counts_to_its_last_whole_line(tmp_path, capsys):
    """What a run killed mid-append leaves: the whole lines still count, without a word."""
    later = {**GOOD, "step": 20, "slot_accuracy": [0.7, 0.6], "eval_tau": 2.5}
    (tmp_path / "train_log.jsonl").write_text(
        json.dumps(GOOD) + "\n" + json.dumps(later) + '\n{"step": 30, "slot_accu')
    assert block_choice.logged_acceptance(tmp_path) == [0.7, 0.6]
    claim = drafter_check.training_log_claim(tmp_path)
    assert claim["step"] == 20 and claim["eval_tau"] == 2.5
    assert capsys.readouterr().err == ""


def test_a_training_log_that_is_a_fifo_is_not_opened(tmp_path, capsys):
    os.mkfifo(tmp_path / "train_log.jsonl")
    assert block_choice.logged_acceptance(tmp_path) is None
    assert drafter_check.training_log_claim(tmp_path) is None
    assert capsys.readouterr().err.count("note: ") == 2


def test_a_claim_without_a_tau_estimate_still_prints(capsys):
    """A log of another trainer may lack tau_estimate: the report says "-", not a TypeError."""
    score = drafter_check.Score(1.5, [0.5], 1.5)
    report = drafter_check.Report(1.5, [0.5], {"step": 3, "slot_accuracy": [0.5],
                                               "tau_estimate": None, "eval_tau": None},
                                  {"as configured": score}, "as configured", "fine")
    drafter_check.print_report(report)
    assert "tau estimate -" in capsys.readouterr().out


# ------------------------------------------------------------------ an engine's acceptance

BAD_ENGINE = {
    "deep": (DEEP, "nested too deeply"),
    "a 400-digit count": (json.dumps({"num_drafts": 10, "num_accepted_tokens_per_pos": [10**400]}),
                          "outside 0..1"),
    "a 400-digit rate": (json.dumps([10**400]), "outside 0..1"),
    "NaN": ("[NaN]", "non-empty list of numbers"),
    "Infinity": ("[Infinity]", "outside 0..1"),
    "booleans": ("[true, false]", "non-empty list of numbers"),
    "a duplicate key": ('{"num_drafts": 1, "num_drafts": 2}', "comes twice"),
}


@pytest.mark.parametrize("text, fragment", BAD_ENGINE.values(), ids=BAD_ENGINE.keys())
def test_a_bad_engine_acceptance_file_is_one_line(text, fragment, tmp_path, capsys, no_work):
    engine = tmp_path / "engine.json"
    engine.write_text(text)
    argv = ["--model", str(TARGET), "--draft", str(DRAFTER), "--prompts", str(prompts(tmp_path)),
            "--engine-acceptance", str(engine), "--device", "cpu"]
    refused(drafter_check.main, argv, capsys, str(engine), fragment)


# ------------------------------------------------------------------ outputs over inputs


def over_inputs(folder: Path) -> list:
    """(program, argv, the input it would write over or into) for each benchmark with an output."""
    pair = ["--model", str(TARGET), "--draft", str(DRAFTER), "--device", "cpu"]
    p = prompts(folder)
    engine = folder / "engine.json"
    engine.write_text("[0.9, 0.5]")
    return [
        (bench.main, [*pair, "--prompts", str(p), "--json", str(p)], "--prompts"),
        (bench.main, [*pair, "--prompts", str(p), "--json", str(TARGET / "report.json")],
         "--model"),
        (bench.main, [*pair, "--prompts", str(p), "--json", str(folder)], "folder"),
        (drafter_check.main, [*pair, "--prompts", str(p), "--json", str(p)], "--prompts"),
        (drafter_check.main, [*pair, "--prompts", str(p), "--engine-acceptance", str(engine),
                              "--json", str(engine)], "--engine-acceptance"),
        (drafter_check.main, [*pair, "--prompts", str(p), "--json",
                              str(DRAFTER / "config.json")], "--draft"),
        (block_sweep.main, [*pair, "--prompts", str(p), "--json", str(DRAFTER / "x.json")],
         "--draft"),
        (pass_costs.main, [*pair[:4], "--json", str(TARGET / "config.json")], "--model"),
    ]


def test_an_output_over_an_input_is_refused_before_work(tmp_path, capsys, no_work):
    for main, argv, names in over_inputs(tmp_path):
        before = tree_bytes(tmp_path, TARGET, DRAFTER)
        refused(main, argv, capsys, names)
        assert_untouched(before, tmp_path, TARGET, DRAFTER)


def test_a_link_to_an_input_is_that_input(tmp_path, capsys, no_work):
    p = prompts(tmp_path)
    link = tmp_path / "report.json"
    link.symlink_to(p)
    argv = ["--model", str(TARGET), "--draft", str(DRAFTER), "--prompts", str(p), "--json",
            str(link), "--device", "cpu"]
    refused(bench.main, argv, capsys, "is --prompts")


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib")
def test_a_plots_folder_around_the_prompts_is_refused(tmp_path, capsys, no_work):
    p = prompts(tmp_path)
    argv = ["--model", str(TARGET), "--draft", str(DRAFTER), "--prompts", str(p), "--plots",
            str(tmp_path), "--device", "cpu"]
    refused(bench.main, argv, capsys, "--plots", "holds --prompts")


def test_refuse_overlap_by_hand(tmp_path):
    inputs = {"--model": tmp_path / "model", "--prompts": tmp_path / "p.jsonl", "--x": None}
    for out, relation in ((tmp_path / "p.jsonl", "is"), (tmp_path / "model" / "a", "lies inside"),
                          (tmp_path, "holds")):
        with pytest.raises(UsageError, match=relation):
            refuse_overlap({"--json": out}, inputs)
    refuse_overlap({"--json": tmp_path / "model-report.json"}, inputs)  # apart


# ------------------------------------------------------------------ numbers past the machine


@pytest.mark.parametrize("argv, fragment", [
    (["--threads", "10000"], "--threads"),
    (["--threads", "1,0"], "--threads"),
    (["--context", "1000000000"], "positions"),
    (["--context", "40000", "--new-tokens", "2000"], "positions"),
    (["--seed", "-1"], "--seed"),
])
def test_cpu_study_bounds_its_numbers(argv, fragment, capsys, no_work):
    refused(cpu_study.main, ["--shapes", "tiny", *argv], capsys, fragment)


def test_cpu_study_that_would_measure_nothing_is_refused(tmp_path, capsys, monkeypatch):
    """Every shape too large for the memory: exit 2 and one line, not a report of nothing."""
    monkeypatch.setattr(cpu_study, "available_bytes", lambda: 2**20)
    monkeypatch.setattr(cpu_study, "random_pair", lambda *a: pytest.fail("built a pair"))
    out = tmp_path / "study.json"
    refused(cpu_study.main, ["--shapes", "tiny", "--json", str(out)], capsys,
            "nothing to measure", "tiny bfloat16")
    assert not out.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--threads", "10000"], "--threads"), (["--tokens-per-step", "nan"], "--tokens-per-step"),
    (["--context", "1000000"], "--context")])
def test_pass_costs_bounds_its_numbers(argv, fragment, capsys, monkeypatch):
    monkeypatch.setattr(pass_costs.Drafter, "from_pretrained",
                        lambda *a, **k: pytest.fail("loaded before the refusal"))
    refused(pass_costs.main, ["--model", str(TARGET), "--draft", str(DRAFTER), *argv], capsys,
            fragment)


# ------------------------------------------------------------------ Ctrl-C


def interrupted(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("program", ["bench", "drafter_check", "cpu_study"])
def test_ctrl_c_in_a_benchmark_is_130_one_line_and_no_report(program, tmp_path, capsys,
                                                             monkeypatch):
    out = tmp_path / "report.json"
    out.write_text('{"kept": "from before"}\n')
    before = tree_bytes(tmp_path)
    pair = ["--model", str(TARGET), "--draft", str(DRAFTER), "--device", "cpu"]
    main, argv = {
        "bench": (bench.main, [*pair, "--prompts", str(prompts(tmp_path)), "--no-oracle"]),
        "drafter_check": (drafter_check.main, [*pair, "--prompts", str(prompts(tmp_path))]),
        "cpu_study": (cpu_study.main, ["--shapes", "tiny"]),
    }[program]
    before = tree_bytes(tmp_path)
    work = {"bench": (bench, "benchmark"), "drafter_check": (drafter_check, "check_drafter"),
            "cpu_study": (cpu_study, "study")}[program]
    monkeypatch.setattr(*work, interrupted)
    refused(main, [*argv, "--json", str(out)], capsys, "interrupted", status=130)
    assert_untouched(before, tmp_path)


def test_a_report_write_stopped_midway_leaves_the_old_report(tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    out.write_text("old\n")
    monkeypatch.setattr(checkpoint.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench_common.write_report(out, {"new": Path("x")})
    assert out.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [out]


# ------------------------------------------------------------------ the tutorials' tools


def test_student_copy_help_prints_help(capsys):
    assert tool("student_copy").main(["--help"]) == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    ([], "OUT"), (["a", "b"], "unrecognized"), (["--bogus", "x"], "--bogus")])
def test_student_copy_refuses_a_bad_command_line(argv, fragment, capsys):
    refused(tool("student_copy").main, argv, capsys, fragment)


def destinations(folder: Path) -> dict[str, Path]:
    dangling = folder / "dangling"
    dangling.symlink_to(folder / "nowhere")
    full = folder / "full"
    full.mkdir()
    (full / "mine.txt").write_text("the user's\n")
    a_file = folder / "a-file"
    a_file.write_text("x")
    return {"a dangling link": dangling, "a folder with a file": full, "a file": a_file,
            "under a file": a_file / "copy", "inside the repository": ROOT / "tests" / "copy",
            "under a missing folder": folder / "missing" / "copy"}


@pytest.mark.parametrize("kind", ["a dangling link", "a folder with a file", "a file",
                                  "under a file", "inside the repository",
                                  "under a missing folder"])
def test_student_copy_refuses_a_bad_destination(kind, tmp_path, capsys):
    out = destinations(tmp_path)[kind]
    before = tree_bytes(tmp_path)
    refused(tool("student_copy").main, [str(out)], capsys, str(out.parent))
    assert_untouched(before, tmp_path)
    assert not (ROOT / "tests" / "copy").exists()


@pytest.mark.parametrize("failure, status, fragment", [
    (OSError(28, "No space left on device", "f"), 2, "No space left on device"),
    (PermissionError(13, "Permission denied", "f"), 2, "Permission denied"),
    (KeyboardInterrupt(), 130, "interrupted")])
def test_student_copy_stopped_midway_leaves_nothing(failure, status, fragment, tmp_path, capsys,
                                                    monkeypatch):
    """A full disk, a read-only mount (as root, chmod cannot make one), Ctrl-C: after a few
    files, the copy fails; no partial folder is left, under its name or a temporary one."""
    student_copy = tool("student_copy")
    copied = []

    def copy(source, target):
        if len(copied) == 3:
            raise failure
        copied.append(target)
        shutil.copyfile(source, target)

    monkeypatch.setattr(student_copy.shutil, "copy2", copy)
    refused(student_copy.main, [str(tmp_path / "course")], capsys, fragment, status=status)
    assert len(copied) == 3 and list(tmp_path.iterdir()) == []


def test_student_copy_into_a_read_only_place(tmp_path, capsys, monkeypatch):
    student_copy = tool("student_copy")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(student_copy.tempfile, "mkdtemp", read_only)
    refused(student_copy.main, [str(tmp_path / "course")], capsys, str(tmp_path), "Permission")
    assert list(tmp_path.iterdir()) == []


def test_check_setup_refuses_an_unknown_option(capsys):
    refused(tool("check_setup").main, ["--bogus"], capsys, "--bogus")


# ------------------------------------------------------------------ nothing touched


def test_no_tool_touches_anything_on_bad_input(tmp_path, capsys, no_work, monkeypatch):
    """Each tool refused on bad input leaves its inputs and its outputs byte for byte as they
    were: the prompts, the pair, a report from before, a destination with a user's file."""
    p = prompts(tmp_path)
    old = tmp_path / "old.json"
    old.write_text('{"from": "before"}\n')
    pair = ["--model", str(TARGET), "--draft", str(DRAFTER), "--device", "cpu"]
    full = tmp_path / "course"
    full.mkdir()
    (full / "notes.md").write_text("mine\n")
    runs = [
        (bench.main, [*pair, "--prompts", str(p), "--json", str(p)]),
        (bench.main, [*pair, "--prompts", str(p), "--json", str(old), "--max-new-tokens", "0"]),
        (drafter_check.main, [*pair, "--prompts", str(p), "--json", str(p)]),
        (drafter_check.main, [*pair, "--prompts", str(p), "--json", str(old),
                              "--engine-acceptance", str(tmp_path / "missing.json")]),
        (cpu_study.main, ["--shapes", "tiny", "--context", "1000000000", "--json", str(old)]),
        (tool("student_copy").main, [str(full)]),
        (tool("student_copy").main, [str(old)]),
    ]
    for main, argv in runs:
        before = tree_bytes(tmp_path, TARGET, DRAFTER)
        refused(main, argv, capsys)
        assert_untouched(before, tmp_path, TARGET, DRAFTER)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("program", ["bench", "drafter_check", "make_data"])
def test_raw_with_thinking_is_refused_by_every_program_that_renders_prompts(program, tmp_path,
                                                                           capsys):
    """--raw turns the chat template off and --thinking renders it: a contradiction, refused
    before any model loads, as generate.py refuses it."""
    main = {"bench": bench.main, "drafter_check": drafter_check.main, "make_data": make_data.main}
    argv = ["--raw", "--thinking", "--prompts", str(tmp_path / "p.jsonl")]
    argv += ["--target", str(tmp_path / "t"), "--out", str(tmp_path / "o.jsonl")] \
        if program == "make_data" else ["--model", str(tmp_path / "t"), "--draft", str(tmp_path / "d")]
    refused(main[program], argv, capsys, "--thinking", "--raw")
