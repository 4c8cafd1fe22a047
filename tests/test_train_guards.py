"""train.py against what an attacker tries (issue 40): sizes bounded before memory is taken, a run
folder one run owns, a save that neither a second signal nor a full disk can cut in half, a resume
that compares the data's contents and follows a moved folder, and input refused in one line."""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
from dflash import training
from tests.test_train import short_context_target

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TINY = FIXTURES / "qwen3-tiny"


def write_data(path: Path, count: int = 8, length: int = 20, seed: int = 0) -> Path:
    generator = torch.Generator().manual_seed(seed)
    path.write_text("".join(
        json.dumps({"input_ids": torch.randint(0, 512, (length,), generator=generator).tolist(),
                    "loss_mask": [0] * 6 + [1] * (length - 6)}) + "\n" for _ in range(count)))
    return path


def argv(data: Path, out: Path, *extra: str, target: Path = TINY) -> list[str]:
    return ["--target", str(target), "--data", str(data), "--out", str(out), "--drafter-layers", "1",
            "--block-size", "4", "--num-anchors", "4", "--batch-size", "3", "--steps", "6",
            "--log-every", "1", "--device", "cpu", *extra]


def one_error_line(capsys, arguments) -> str:
    capsys.readouterr()
    try:
        status = train.main(arguments)
    except SystemExit as exit:  # the argument parser's own refusals
        status = exit.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, lines)
    return lines[0]


@pytest.fixture
def no_training(monkeypatch):
    """A refusal must come before the first step."""
    def started(*args, **kwargs):
        raise AssertionError("a step started before the input was refused")

    monkeypatch.setattr(train, "drafter_loss", started)


def weights_of(out: Path) -> dict:
    return load_file(out / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


# ------------------------------------------------------------------ sizes, bounded first


def test_a_block_past_the_targets_positions_is_refused(tmp_path, capsys, no_training):
    error = one_error_line(capsys, argv(write_data(tmp_path / "d.jsonl"), tmp_path / "run",
                                        "--block-size", "100000"))
    assert "--block-size 100000" in error and "2048 positions (max_position_embeddings)" in error


def test_an_init_from_drafter_with_a_huge_block_is_refused(tmp_path, capsys, no_training):
    drafter = tmp_path / "drafter"
    shutil.copytree(FIXTURES / "dflash-tiny", drafter)
    config = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "block_size": 100000}))
    arguments = ["--target", str(FIXTURES / "qwen3-tiny-sharded"), "--init-from", str(drafter),
                 "--data", str(write_data(tmp_path / "d.jsonl")), "--out", str(tmp_path / "run"),
                 "--steps", "2", "--device", "cpu"]
    error = one_error_line(capsys, arguments)
    assert "block_size 100000" in error and "max_position_embeddings" in error


def test_a_step_larger_than_the_machine_is_refused_before_it_is_built(tmp_path, capsys,
                                                                       no_training):
    """Blocks of 2,000 within the target's positions, 512 anchors in sequences of 2,000 tokens: the
    CPU's mask alone would be a terabyte."""
    data = write_data(tmp_path / "d.jsonl", count=3, length=2000)
    error = one_error_line(capsys, argv(data, tmp_path / "run", "--block-size", "2000",
                                        "--num-anchors", "512"))
    assert "--block-size 2000" in error and "GiB" in error and "memory" in error


def test_max_seq_len_is_capped_at_the_targets_positions_and_the_cut_is_said(tmp_path, capsys):
    target = short_context_target(tmp_path, context=16)
    data = write_data(tmp_path / "d.jsonl", length=20)
    assert train.main(argv(data, tmp_path / "run", "--max-seq-len", "100000000",
                           target=target)) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: 8 sequence(s) longer than 16 tokens (the target's "
                     "max_position_embeddings, below --max-seq-len 100000000) were cut at the end "
                     "(--cut answer-end): 32 tokens left out, 32 of them answer tokens"]


# ------------------------------------------------------------------ a folder one run owns


def start_training(data: Path, out: Path, *extra: str) -> subprocess.Popen:
    arguments = argv(data, out, *extra)
    arguments[arguments.index("--steps") + 1] = "100000"
    return subprocess.Popen([sys.executable, "train.py", *arguments], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_steps(process: subprocess.Popen, out: Path, steps: int) -> None:
    log, deadline = out / "train_log.jsonl", time.time() + 120
    while not (log.is_file() and len(log.read_text().splitlines()) >= steps):
        assert process.poll() is None and time.time() < deadline, "the run ended too early"
        time.sleep(0.02)


def test_a_second_run_into_a_busy_folder_is_refused_and_a_crashed_runs_lock_is_not(tmp_path,
                                                                                 capsys):
    data, out = write_data(tmp_path / "d.jsonl"), tmp_path / "run"
    first = start_training(data, out, "--save-every", "2")
    try:
        wait_for_steps(first, out, 3)
        for extra in (["--force"], [], ["--resume"]):
            assert "another run is training in it" in one_error_line(capsys, argv(data, out, *extra))
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()  # kill -9: its lock stays behind, naming a process that is gone
        first.communicate(timeout=60)
    assert (out / training.LOCK_FILE).is_file()
    assert train.main(argv(data, out, "--resume", "--steps", "100000", "--stop-at",
                           str(torch.load(out / "training_state.pt", weights_only=True)["step"] + 1))) == 0
    assert not (out / training.LOCK_FILE).exists()  # released on exit


# ------------------------------------------------------------------ saves that are never cut


def test_a_second_sigint_during_a_save_waits_for_the_save(tmp_path, capsys, monkeypatch):
    """Ctrl-C, then Ctrl-C again while the first save runs: the save ends whole, then the second
    stops the run in one line, and the run resumes."""
    data, out = write_data(tmp_path / "d.jsonl"), tmp_path / "run"
    real_save = training.save_training_state

    def interrupted_save(path, state):
        for _ in range(2):  # the first asks for a stop; the second lands in the save
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        real_save(path, state)

    monkeypatch.setattr(training, "save_training_state", interrupted_save)
    capsys.readouterr()
    try:
        status = train.main(argv(data, out, "--save-every", "2"))
    except KeyboardInterrupt:  # what the starting commit let through, mid-save
        status = "KeyboardInterrupt"
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 130 and lines[-1].startswith("stopped at once by SIGINT"), lines
    assert torch.load(out / "training_state.pt", weights_only=True)["step"] == 2
    monkeypatch.setattr(training, "save_training_state", real_save)
    assert train.main(argv(data, out, "--resume")) == 0


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_resumable(tmp_path, capsys,
                                                                          monkeypatch):
    data = write_data(tmp_path / "d.jsonl")
    assert train.main(argv(data, tmp_path / "straight")) == 0
    out, real_save, saves = tmp_path / "run", torch.save, []

    def full_disk_at_the_second_save(obj, path, *args, **kwargs):
        saves.append(obj)
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_at_the_second_save)
    capsys.readouterr()
    assert train.main(argv(data, out, "--save-every", "2")) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's lines
    assert error.startswith("error: saving step 4 failed (No space left on device)")
    assert "keeps step 2's checkpoint, complete" in error and "--resume" in error
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(out / "training_state.pt", weights_only=True)["step"] == 2
    assert train.main(argv(data, out, "--resume")) == 0
    assert same_weights(weights_of(tmp_path / "straight"), weights_of(out))


def test_a_file_size_limit_during_the_first_save_is_one_line(tmp_path):
    """`ulimit -f`: the drafter's weights fit, its training state (weights and AdamW's moments)
    does not; nothing was saved before, and the error says so."""
    data, out = write_data(tmp_path / "d.jsonl"), tmp_path / "run"
    limit = 400_000  # bytes: the tiny drafter's weights are about 190 kB, its state about 580 kB

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run([sys.executable, "train.py", *argv(data, out, "--save-every", "2")],
                            cwd=ROOT, capture_output=True, text=True, preexec_fn=limited,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith("error: saving step 2 failed (File too large)"), lines[-1]
    assert "no checkpoint yet" in lines[-1]
    assert not list(out.glob("*.tmp"))


# ------------------------------------------------------------------ what a resume compares


def test_resume_refuses_data_whose_contents_changed_under_the_same_name(tmp_path, capsys):
    data, out = write_data(tmp_path / "d.jsonl"), tmp_path / "run"
    assert train.main(argv(data, out, "--stop-at", "2")) == 0
    write_data(data, seed=1)  # other answers, the same path
    assert "data file's contents changed" in one_error_line(capsys, argv(data, out, "--resume"))


def test_a_moved_run_folder_and_moved_data_resume_exactly(tmp_path):
    data = write_data(tmp_path / "d.jsonl")
    assert train.main(argv(data, tmp_path / "straight")) == 0
    assert train.main(argv(data, tmp_path / "before", "--stop-at", "3")) == 0
    moved, moved_data = tmp_path / "elsewhere" / "after", tmp_path / "elsewhere" / "d.jsonl"
    moved.parent.mkdir()
    shutil.move(tmp_path / "before", moved)
    shutil.move(data, moved_data)
    assert train.main(argv(moved_data, moved, "--resume")) == 0
    assert same_weights(weights_of(tmp_path / "straight"), weights_of(moved))


def test_one_command_starts_and_resumes(tmp_path):
    """--auto-resume: the same command starts the run, then, run again (after a stop, a crash, a
    preemption), continues it from its checkpoint, to the uninterrupted run's weights."""
    data = write_data(tmp_path / "d.jsonl")
    assert train.main(argv(data, tmp_path / "straight")) == 0
    command = argv(data, tmp_path / "run", "--auto-resume", "--save-every", "2")
    assert train.main([*command, "--stop-at", "3"]) == 0  # a job that ends early
    assert torch.load(tmp_path / "run" / "training_state.pt", weights_only=True)["step"] == 3
    assert train.main(command) == 0
    assert same_weights(weights_of(tmp_path / "straight"), weights_of(tmp_path / "run"))
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "train_log.jsonl").open()]
    assert steps == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------ input refused in one line


def test_a_seed_past_64_bits_is_one_line(tmp_path, capsys, no_training):
    error = one_error_line(capsys, argv(write_data(tmp_path / "d.jsonl"), tmp_path / "run",
                                        "--seed", "1180591620717411303424"))
    assert "--seed" in error


def test_a_float16_target_trains_on_the_cpu(tmp_path):
    """The target in float16, the drafter trained in float32 (its features are cast for it) and
    saved in the target's dtype, as it would be served."""
    out = tmp_path / "run"
    assert train.main(argv(write_data(tmp_path / "d.jsonl"), out, "--dtype", "float16")) == 0
    assert all(tensor.dtype == torch.float16 for tensor in weights_of(out).values())
    state = torch.load(out / "training_state.pt", weights_only=True)
    assert all(tensor.dtype == torch.float32 for tensor in state["model"].values())


@pytest.mark.parametrize("record, message", [
    ({"input_ids": [True, False, 5, 6], "loss_mask": [0, 0, 1, 1]}, "input_ids must be integers"),
    ({"input_ids": [4, 5, 6, 7], "loss_mask": [0, 0, float("nan"), 1]}, "loss_mask must hold"),
    ({"input_ids": [4, 5, 6, 7], "loss_mask": [0, 0, "1", 1]}, "loss_mask must hold"),
    ({"input_ids": [4, 5, 6, 7], "loss_mask": [0, 0, True, 1]}, "loss_mask must hold"),
])
def test_lenient_data_values_are_refused_in_one_line(tmp_path, capsys, no_training, record,
                                                     message):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(record) + "\n")  # NaN: Python's json writes and reads it
    error = one_error_line(capsys, argv(data, tmp_path / "run"))
    assert f"{data}:1: " in error and message in error


def test_fsdp_without_torchrun_is_refused(tmp_path, capsys, no_training):
    error = one_error_line(capsys, argv(write_data(tmp_path / "d.jsonl"), tmp_path / "run",
                                        "--fsdp"))
    assert "--fsdp" in error and "torchrun" in error


def test_the_drafter_is_saved_in_the_dtype_it_is_served_in(tmp_path):
    """--save-dtype bfloat16: model.safetensors (and its config) in bf16, the float32 run's weights
    rounded; the training state keeps float32, so the run resumes as exactly as before."""
    data = write_data(tmp_path / "d.jsonl")
    assert train.main(argv(data, tmp_path / "f32")) == 0
    assert train.main(argv(data, tmp_path / "bf16", "--save-dtype", "bfloat16", "--stop-at", "3")) == 0
    assert train.main(argv(data, tmp_path / "bf16", "--resume", "--save-dtype", "bfloat16")) == 0
    full, served = weights_of(tmp_path / "f32"), weights_of(tmp_path / "bf16")
    assert all(served[name].dtype == torch.bfloat16 for name in served)
    assert all(torch.equal(served[name], full[name].to(torch.bfloat16)) for name in full)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    state = torch.load(tmp_path / "bf16" / "training_state.pt", weights_only=True)
    assert all(tensor.dtype == torch.float32 for tensor in state["model"].values())
