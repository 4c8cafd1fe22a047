"""generate.py as a user runs it: JSON output, --compare, and one clear line for every bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny"
REFERENCE = load_file(TARGET / "reference.safetensors")
PROMPT_IDS = ",".join(map(str, REFERENCE["greedy_prompt"][0].tolist()))
EXPECTED = REFERENCE["greedy_output"][0, 9:].tolist()  # 40 greedy new tokens
# The fixture's config says bfloat16 (as the authors' does), so `--dtype auto` may load it in
# bfloat16 where the CPU multiplies it natively; its greedy reference was made in float32.
PAIR = ["--model", str(TARGET), "--draft", str(DRAFTER), "--dtype", "float32"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "generate.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_json_output_is_the_greedy_reference():
    done = run("--prompt-ids", PROMPT_IDS, *PAIR, "--max-new-tokens", "40", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["output_ids"] == EXPECTED
    assert report["new_tokens"] == 40 and report["steps"] == len(report["acceptance_lengths"])
    assert report["mean_acceptance"] == sum(report["acceptance_lengths"]) / report["steps"]
    assert report["tokens_per_second"] > 0 and report["text"] == ""


def test_compare_reports_both_loops_and_the_speedup():
    done = run("--prompt-ids", PROMPT_IDS, *PAIR, "--max-new-tokens", "16", "--compare", "--json",
               "--block-size", "4")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["output_ids"] == report["baseline_output_ids"] == EXPECTED[:16]
    assert report["speedup"] > 0 and report["baseline_tokens_per_second"] > 0


def test_plain_text_run_prints_a_summary():
    done = run("--prompt-ids", PROMPT_IDS, *PAIR, "--max-new-tokens", "8", "--no-draft")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(token) for token in EXPECTED[:8]]  # no tokenizer: the ids
    assert "8 new tokens" in done.stderr


BAD_INPUTS = {
    "missing model": ["--model", "no/such/folder", "--draft", str(DRAFTER), "--prompt-ids", "1"],
    "missing drafter": ["--model", str(TARGET), "--draft", "no/such/drafter", "--prompt-ids", "1"],
    "drafter that does not fit": ["--model", str(FIXTURES / "qwen3-tiny"), "--draft", str(DRAFTER),
                                  "--prompt-ids", "1"],
    "too long": [*PAIR, "--prompt-ids", "1", "--max-new-tokens", "5000"],
    "empty prompt": [*PAIR, "--prompt-ids", ""],
    "no prompt": [*PAIR],
    "zero new tokens": [*PAIR, "--prompt-ids", "1", "--max-new-tokens", "0"],
    "negative temperature": [*PAIR, "--prompt-ids", "1", "--temperature", "-0.5"],
    "block too big": [*PAIR, "--prompt-ids", "1", "--block-size", "9"],
    "block too small": [*PAIR, "--prompt-ids", "1", "--block-size", "1"],
    "unknown device": [*PAIR, "--prompt-ids", "1", "--device", "tpu"],
    "ids not integers": [*PAIR, "--prompt-ids", "1,two,3"],
    "id outside vocabulary": [*PAIR, "--prompt-ids", "1,600"],
    "text without tokenizer": [*PAIR, "--prompt", "hello"],
    "not a number": [*PAIR, "--prompt-ids", "1", "--max-new-tokens", "many"],
}


def main_in_process(argv, capsys) -> tuple[int, str]:
    """Run generate.main here (a subprocess per case would spend its time importing torch)."""
    import generate

    try:
        code = generate.main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_error_line_and_exit_2(case, capsys):
    code, stderr = main_in_process(BAD_INPUTS[case], capsys)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr


@pytest.mark.parametrize("case", ["missing drafter", "unknown device"])
def test_bad_input_in_a_real_process_has_no_traceback(case):
    done = run(*BAD_INPUTS[case])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_only_the_projects_errors_become_one_line_a_bug_keeps_its_traceback():
    """A bare ValueError is a programming error: run_cli must not turn it into 'error: ...' and exit 2."""
    import argparse

    from dflash.cli import UsageError, run_cli

    def bad_input(args):
        raise UsageError("--x must be positive")

    def bug(args):
        raise ValueError("math domain error")

    assert run_cli(argparse.ArgumentParser(), bad_input, []) == 2
    with pytest.raises(ValueError, match="math domain"):
        run_cli(argparse.ArgumentParser(), bug, [])


# ------------------------------------------------------------------ prompt files


def test_the_prompt_file_format(tmp_path):
    """One format: JSONL objects with exactly one of "prompt", "messages", "prompt_ids"; "answer" kept as text,
    other fields ignored, blank lines skipped but counted in "file:line"."""
    from dflash.prompts import Prompt, read_prompts

    turn = [{"role": "user", "content": "2 + 2?"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(record) for record in [
        {"prompt": "Once upon a time"}, {"messages": turn, "kind": "addition", "answer": 4}]) + "\n\n"
        + json.dumps({"prompt_ids": [1, 2, 3], "answer": None}) + "\n")
    assert read_prompts(path) == [Prompt(f"{path}:1", text="Once upon a time"),
                                  Prompt(f"{path}:2", messages=turn, answer="4"),
                                  Prompt(f"{path}:4", ids=[1, 2, 3])]


@pytest.mark.parametrize("content, message", [
    ('{"prompt": ""}', "'prompt' must be a non-empty str"),
    ('{"prompt": 5}', "'prompt' must be a non-empty str"),
    ('{"prompt_ids": [1, "2"]}', "'prompt_ids' must be a non-empty list of int"),
    ('{"prompt_ids": []}', "'prompt_ids' must be a non-empty list of int"),
    ('{"messages": ["hi"]}', "'messages' must be a non-empty list of dict"),
    ('{"answer": 4}', "exactly one of 'prompt', 'messages' or 'prompt_ids'"),
    ('[1, 2]', "exactly one of"),
    ('{"prompt": "a",', "not valid JSON"),
])
def test_a_bad_prompt_line_is_one_error_naming_file_and_line(tmp_path, content, message):
    from dflash.cli import UsageError
    from dflash.prompts import read_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n' + content + "\n")
    with pytest.raises(UsageError) as caught:
        read_prompts(path)
    assert str(caught.value).startswith(f"{path}:2: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_empty_or_missing_prompt_file_is_one_error(tmp_path):
    from dflash.cli import UsageError
    from dflash.prompts import read_prompts

    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UsageError, match="no prompts"):
        read_prompts(tmp_path / "empty.jsonl")
    with pytest.raises(UsageError, match="prompts file not found"):
        read_prompts(tmp_path / "missing.jsonl")


def test_a_seed_is_what_torch_generators_take():
    """`dflash.cli.seed`, every program's --seed type: torch's manual_seed overflows past it."""
    import argparse

    from dflash.cli import seed

    assert seed("0") == 0 and seed(str(2**64 - 1)) == 2**64 - 1
    for bad in ("1180591620717411303424", str(2**64), "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"0\.\.2\*\*64 - 1"):
            seed(bad)


def test_a_device_index_must_exist():
    import torch

    from dflash.cli import UsageError, pick_device

    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("cpu:0") == torch.device("cpu:0")
    for name in ("cpu:5", "cuda:1000"):
        with pytest.raises(UsageError, match=f"device '{name}' is not available here"):
            pick_device(name)


def test_a_thread_count_is_bounded_by_the_cores():
    """Found by tests/test_walk_options.py: bench.py --threads 1180591620717411303424 overflowed."""
    import argparse
    import os

    from dflash.cli import thread_count

    assert thread_count("1") == 1 and thread_count(str(os.cpu_count())) == os.cpu_count()
    for bad in ("0", str(os.cpu_count() + 1), "1180591620717411303424"):
        with pytest.raises(argparse.ArgumentTypeError, match="an integer in 1.."):
            thread_count(bad)


def test_torch_threads_default_to_the_physical_cores_less_one(monkeypatch):
    """Issue 39: with every core taken by torch, one core busy with another process stalls every
    step. The default leaves a core free; $OMP_NUM_THREADS (torchrun's) wins; run_cli applies it."""
    import torch

    import generate
    from dflash import cli

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores, threads in ((1, 1), (2, 1), (16, 15)):
        monkeypatch.setattr(cli, "physical_cores", lambda: cores)
        assert cli.default_threads() == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torchrun's, or the user's
    assert cli.default_threads() == 3
    plain = ["--prompt-ids", "1,2", "--max-new-tokens", "2", "--no-draft", "--model", str(TARGET),
             "--device", "cpu", "--json"]
    try:
        assert generate.main([*plain, "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(cli, "default_threads", lambda: 2)
        assert generate.main(plain) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_auto_dtype_on_a_cpu_follows_the_checkpoint_and_the_cpus_bfloat16_units(tmp_path, monkeypatch):
    """bfloat16 only where the checkpoint is stored in it and the CPU multiplies it itself."""
    import json

    import torch

    from dflash import cli
    stored = {"bf16": {"dtype": "bfloat16"}, "old_bf16": {"torch_dtype": "bfloat16"},
              "fp32": {"dtype": "float32"}, "list": [1, 2]}
    for name, config in stored.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    cpu = torch.device("cpu")
    for units, expected in ((True, {"bf16", "old_bf16"}), (False, set())):
        monkeypatch.setattr(cli, "cpu_multiplies_bfloat16", lambda: units)
        chosen = {name for name in stored if cli.pick_dtype("auto", cpu, tmp_path / name) == torch.bfloat16}
        assert chosen == expected
    assert cli.pick_dtype("auto", cpu, tmp_path / "missing") == torch.float32
    assert cli.pick_dtype("float16", cpu, tmp_path / "bf16") == torch.float16
    assert cli.pick_dtype("auto", torch.device("cuda"), tmp_path / "fp32") == torch.bfloat16
