"""One step, however it is shared out: train.py on one process, on two (DDP and FSDP2, gloo on the CPU) and with
gradient accumulation trains the same drafter from the same global batch, up to the order of float sums; a run
under torchrun stopped by a signal and resumed ends where the uninterrupted run ends, bit for bit.

The runs are shared by the tests (module-scoped): 8 short sequences, a global batch of 4, `STEPS` steps."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.training import Signals

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"
STEPS = 80  # 40 epochs of 2 steps: long enough that a signal sent after step 2 lands mid-run
# name: (processes, per-process batch, extra options); each a global batch of 4 sequences
WAYS = {"1 x 4": (1, 4, ()), "1 x 2, accumulating 2": (1, 2, ("--grad-accum", "2")),
        "2 x 2 DDP": (2, 2, ()), "2 x 2 FSDP2": (2, 2, ("--fsdp",)),
        "2 x 1 FSDP2, accumulating 2": (2, 1, ("--fsdp", "--grad-accum", "2"))}


def train_argv(data: Path, out: Path, batch_size: int, *extra: str) -> list[str]:
    return ["--target", str(TINY), "--data", str(data), "--out", str(out), "--drafter-layers", "1",
            "--block-size", "4", "--num-anchors", "4", "--batch-size", str(batch_size), "--steps", str(STEPS),
            "--log-every", "1", "--device", "cpu", *extra]


def torchrun(argv: list[str]) -> subprocess.Popen:
    """Two CPU processes (gloo) under torchrun, one thread each."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *argv]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def two_processes(argv: list[str]) -> None:
    """What torchrun starts, started by hand: two processes with its environment (rank, world, where to meet),
    without its agent, a third process that would import torch too."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    meeting = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **meeting, "RANK": str(rank), "LOCAL_RANK": str(rank)})
                 for rank in range(2)]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]


def run_to_the_end(way: str, data: Path, out: Path, *extra: str) -> None:
    processes, batch_size, options = WAYS[way]
    argv = train_argv(data, out, batch_size, *options, *extra)
    if processes == 1:
        assert train.main(argv) == 0
    else:
        two_processes(argv)


def log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    generator = torch.Generator().manual_seed(0)
    lines = []
    for length in (20, 14, 20, 17, 20, 11, 20, 16):  # answers of several lengths: the processes' slot counts differ
        ids = torch.randint(0, 512, (length,), generator=generator).tolist()
        lines.append(json.dumps({"input_ids": ids, "loss_mask": [0] * 6 + [1] * (length - 6)}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory) -> dict[str, Path]:
    """Every way, run to the end."""
    folders = {way: tmp_path_factory.mktemp("run") for way in WAYS}
    torch.set_num_threads(1)
    for way, out in folders.items():
        run_to_the_end(way, data, out)
    return folders


@pytest.mark.parametrize("way", [way for way in WAYS if way != "1 x 4"])
def test_a_step_trains_the_same_drafter_however_it_is_shared_out(runs, way):
    """The same weights, and at every step the same loss and gradient norm (a world size left in the gradient's
    scale would show in its norm, though AdamW and the clip hide it in the weights)."""
    alone, shared = load_file(runs["1 x 4"] / "model.safetensors"), load_file(runs[way] / "model.safetensors")
    for name in alone:
        torch.testing.assert_close(shared[name], alone[name], rtol=1e-5, atol=1e-6)
    expected, got = log(runs["1 x 4"]), log(runs[way])
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [r["sequences"] for r in got] == [4 * r["step"] for r in got]
    for field in ("loss", "grad_norm"):
        torch.testing.assert_close(torch.tensor([r[field] for r in got]), torch.tensor([r[field] for r in expected]),
                                   rtol=1e-5, atol=0)
    assert expected[-1]["loss"] < expected[0]["loss"] - 0.2  # it did train


def test_a_two_process_checkpoint_holds_each_process_state_once(runs):
    """Rank 0 alone writes: one log, one loadable drafter, every process's random state."""
    state = torch.load(runs["2 x 2 DDP"] / "training_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and state["step"] == STEPS
    Drafter.from_pretrained(runs["2 x 2 DDP"], target=Qwen3.from_pretrained(TINY))


@pytest.mark.parametrize("way", ["2 x 2 DDP", "2 x 2 FSDP2"])
def test_a_torchrun_run_stopped_by_a_signal_resumes_to_the_uninterrupted_result(runs, data, tmp_path, way):
    """SIGTERM to torchrun (as a scheduler sends it): torchrun passes it on, every process ends its step, rank 0
    saves; --resume then ends on the uninterrupted run's weights, bit for bit, each step logged once."""
    _, batch_size, options = WAYS[way]
    process = torchrun(train_argv(data, tmp_path, batch_size, *options))
    deadline = time.time() + 120
    logged = tmp_path / "train_log.jsonl"
    while not (logged.is_file() and len(logged.read_text().splitlines()) >= 2):
        assert process.poll() is None and time.time() < deadline, "the run ended before it could be stopped"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    stopped_at = torch.load(tmp_path / "training_state.pt", weights_only=True)["step"]
    assert 2 <= stopped_at < STEPS
    assert f"stopped by SIGTERM at step {stopped_at}: checkpoint saved" in stderr
    run_to_the_end(way, data, tmp_path, "--resume")
    expected, got = load_file(runs[way] / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    assert [r["step"] for r in log(tmp_path)] == list(range(1, STEPS + 1))


def test_under_torchrun_the_passed_on_signal_does_not_cut_the_step(monkeypatch):
    """A terminal's Ctrl-C or a scheduler's SIGTERM reaches torchrun's whole process group, and torchrun passes
    it on again: a worker gets it twice, and must still end its step and save (torchrun kills it if too slow)."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    with Signals() as stop:
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert stop.name == "SIGINT"
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(KeyboardInterrupt), Signals():  # alone, a second Ctrl-C acts at once
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)


@pytest.mark.parametrize("way", ["2 x 2 DDP", "2 x 2 FSDP2"])
def test_the_evaluation_under_torchrun_pools_every_process_prompts(data, tmp_path, way):
    """--eval-prompts under DDP and FSDP2 (whose drafter is gathered from its shards): each process
    replays its share of the held-out prompts, and the pooled figures are those of one process
    replaying them all."""
    prompts = tmp_path / "heldout.jsonl"
    generator = torch.Generator().manual_seed(1)
    prompts.write_text("".join(json.dumps({"prompt_ids": torch.randint(0, 512, (6 + i,), generator=generator)
                                           .tolist()}) + "\n" for i in range(5)))  # 3 and 2 a process
    extra = ("--steps", "4", "--eval-prompts", str(prompts), "--eval-max-new-tokens", "12")
    run_to_the_end("1 x 4", data, tmp_path / "alone", *extra)
    run_to_the_end(way, data, tmp_path / "shared", *extra)
    alone, shared = log(tmp_path / "alone")[-1], log(tmp_path / "shared")[-1]
    assert alone["eval_tau"] is not None and len(alone["eval_slot_acceptance"]) == 3
    assert (shared["eval_tau"], shared["eval_slot_acceptance"]) == (alone["eval_tau"],
                                                                   alone["eval_slot_acceptance"])


def test_a_two_process_run_resumes_on_one_process(runs, data, tmp_path):
    """Stopped on 2 processes (DDP), resumed on 1 with the same global batch (4 sequences a step),
    it ends where the uninterrupted one-process run ends, up to the order of float sums; a resume
    that would change the global batch is refused."""
    run_to_the_end("2 x 2 DDP", data, tmp_path, "--stop-at", str(STEPS // 2))
    assert torch.load(tmp_path / "training_state.pt", weights_only=True)["step"] == STEPS // 2
    assert train.main(train_argv(data, tmp_path, 2, "--resume")) == 2  # 2 sequences a step: refused
    run_to_the_end("1 x 4", data, tmp_path, "--resume")
    alone, resumed = load_file(runs["1 x 4"] / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    for name in alone:
        torch.testing.assert_close(resumed[name], alone[name], rtol=1e-5, atol=1e-6)
    assert [r["step"] for r in log(tmp_path)] == list(range(1, STEPS + 1))


@pytest.mark.parametrize("way", ["2 x 2 DDP", "2 x 1 FSDP2, accumulating 2"])
def test_the_held_out_figures_under_torchrun_are_one_process_figures(tmp_path, way):
    """--heldout under DDP and FSDP2: each process scores its share of the 3 held-out sequences
    (under FSDP2 with 1 a batch, the second process runs a stand-in forward while the first scores
    its second), and the pooled loss and per-slot accuracy are one process's, up to the order of
    float sums; best/ keeps the same step."""
    generator = torch.Generator().manual_seed(2)
    twice = [torch.randint(0, 512, (length,), generator=generator).tolist() for length in (18, 15)]
    repeated = tmp_path / "repeated.jsonl"  # held out: copies of trained ones, so some hits
    repeated.write_text("".join(json.dumps({"input_ids": ids, "loss_mask": [0] * 6 + [1] * (len(ids)
                                            - 6)}) + "\n" for ids in twice * 5))
    extra = ("--steps", "20", "--heldout", "3", "--eval-every", "10", "--lr", "1e-2")
    run_to_the_end("1 x 4", repeated, tmp_path / "alone", *extra)
    run_to_the_end(way, repeated, tmp_path / "shared", *extra)
    alone, shared = ([r for r in log(tmp_path / name) if "heldout_loss" in r]
                     for name in ("alone", "shared"))
    assert [r["step"] for r in alone] == [r["step"] for r in shared] == [10, 20]
    assert max(alone[-1]["heldout_slot_accuracy"]) > 0
    for expected, got in zip(alone, shared):
        assert got["heldout_loss"] == pytest.approx(expected["heldout_loss"], rel=1e-5)
        assert got["heldout_slot_accuracy"] == pytest.approx(expected["heldout_slot_accuracy"],
                                                             abs=2e-4)
    best = [json.loads((tmp_path / name / "best" / "best.json").read_text())["step"]
            for name in ("alone", "shared")]
    assert best[0] == best[1]
