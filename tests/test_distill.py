"""Distillation (`train.py --distill-weight`): the drafter matches the target's own distribution at
each block slot. The loss against a hand computation, its chunked path against the dense one, the
hard loss where the target is certain (which pins the position convention: x_p's distribution is
the target's output at p - 1), and runs that train, resume, refuse a changed weight, read packed
data and give the same drafter on two processes (DDP, FSDP2) as on one."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import make_data
import train
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.train_kernels import chunked_lm_head_loss
from test_train import one_error_line
from test_train_distributed import two_processes

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"
DEMO = ROOT / "weights" / "tiny-qwen3"  # trained: its greedy answers vary (the fixture's repeat)


# ------------------------------------------------------------------ the loss, by hand


def softmax_by_hand(row: list[float]) -> list[float]:
    top = max(row)
    exponentials = [math.exp(x - top) for x in row]
    return [e / sum(exponentials) for e in exponentials]


def loss_and_gradient_by_hand(hidden, head, teacher, labels, weights, distill_weight):
    """sum_i w_i ((1 - d) * -log q_i[label_i] + d * sum_v p_iv log(p_iv / q_iv)), q the drafter's
    softmax, p the target's, and its gradient w_i ((q_i - (1 - d) one_hot - d p_i) @ head), in
    Python floats, loop by loop."""
    vocab, width = len(head), len(head[0])
    total, gradient = 0.0, []
    for h, t, label, w in zip(hidden, teacher, labels, weights):
        q = softmax_by_hand([sum(h[j] * head[v][j] for j in range(width)) for v in range(vocab)])
        p = softmax_by_hand([sum(t[j] * head[v][j] for j in range(width)) for v in range(vocab)])
        kl = sum(p[v] * math.log(p[v] / q[v]) for v in range(vocab) if p[v] > 0)
        total += w * ((1 - distill_weight) * -math.log(q[label]) + distill_weight * kl)
        d_logits = [q[v] - (1 - distill_weight) * (v == label) - distill_weight * p[v]
                    for v in range(vocab)]
        gradient.append([w * sum(d_logits[v] * head[v][j] for v in range(vocab))
                         for j in range(width)])
    return total, gradient


def small_case(seed=0, rows=6, vocab=7, width=5):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    head = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
    teacher = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    weights = torch.rand(rows, generator=generator, dtype=torch.float64)
    return hidden, head, teacher, labels, weights


@pytest.mark.parametrize("distill_weight", [1.0, 0.3, 0.0])
@pytest.mark.parametrize("chunk_size", [0, 1, 4, 100])
def test_the_loss_and_its_gradient_against_a_hand_computation(chunk_size, distill_weight):
    hidden, head, teacher, labels, weights = small_case()
    expected, expected_gradient = loss_and_gradient_by_hand(
        hidden.tolist(), head.tolist(), teacher.tolist(), labels.tolist(), weights.tolist(),
        distill_weight)
    hidden.requires_grad_()
    loss, hits = chunked_lm_head_loss(hidden, head, labels, weights, chunk_size, teacher=teacher,
                                      distill_weight=distill_weight)
    (gradient,) = torch.autograd.grad(2.0 * loss, hidden)  # an upstream factor, as train.py's
    assert loss.item() == pytest.approx(expected, rel=1e-6)  # the chunks' running sum: float32
    torch.testing.assert_close(gradient, 2.0 * torch.tensor(expected_gradient, dtype=torch.float64),
                               rtol=1e-9, atol=1e-12)
    assert torch.equal(hits, (hidden @ head.T).argmax(-1) == labels)  # still the labels' hits


@pytest.mark.parametrize("chunk_size", [1, 7, 50, 1000])
def test_the_chunked_loss_equals_the_dense_one(chunk_size):
    hidden, head, teacher, labels, weights = small_case(seed=1, rows=50, vocab=97, width=16)
    for distill_weight in (1.0, 0.5):
        hidden.requires_grad_()
        dense, _ = chunked_lm_head_loss(hidden, head, labels, weights, 0, teacher=teacher,
                                        distill_weight=distill_weight)
        (dense_gradient,) = torch.autograd.grad(3.0 * dense, hidden)
        loss, _ = chunked_lm_head_loss(hidden, head, labels, weights, chunk_size,
                                       teacher=teacher, distill_weight=distill_weight)
        (gradient,) = torch.autograd.grad(3.0 * loss, hidden)
        torch.testing.assert_close(loss.double(), dense, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gradient, dense_gradient, rtol=1e-6, atol=1e-9)


def test_a_certain_target_gives_the_hard_loss():
    """The head's rows are orthogonal and each teacher is 200 times the label's row: the target's
    distribution is one-hot at the label (to e^-200), and KL(one-hot || q) is -log q[label]."""
    hidden, _, _, labels, weights = small_case(seed=2, vocab=5, width=8)
    head = torch.eye(5, 8, dtype=torch.float64)
    teacher = 200.0 * head[labels]  # (rows, width)
    hidden.requires_grad_()
    for chunk_size in (0, 4):
        hard, _ = chunked_lm_head_loss(hidden, head, labels, weights, chunk_size)
        (hard_gradient,) = torch.autograd.grad(hard, hidden)
        distilled, _ = chunked_lm_head_loss(hidden, head, labels, weights, chunk_size,
                                                   teacher=teacher)
        (gradient,) = torch.autograd.grad(distilled, hidden)
        torch.testing.assert_close(distilled, hard, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gradient, hard_gradient, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ in train.py's drafter_loss


def greedy_sequences(target: Qwen3, count: int, prompt: int, answer: int) -> torch.Tensor:
    """Random prompts, each followed by the target's greedy answer: (count, prompt + answer)."""
    ids = torch.randint(0, target.config.vocab_size, (count, prompt),
                        generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for _ in range(answer):
            hidden, _ = target(ids)
            ids = torch.cat([ids, target.logits(hidden[:, -1]).argmax(-1, keepdim=True)], dim=1)
    return ids


def test_in_drafter_loss_a_certain_target_gives_the_hard_loss():
    """On the target's greedy answers, x_p is the argmax of the target's output at p - 1: sharpened
    to one-hot there, distillation is the hard loss. At p (a convention off by one) it is not."""
    torch.manual_seed(0)
    target = Qwen3.from_pretrained(DEMO)
    drafter = Drafter(train.build_drafter_config(train.TrainConfig(drafter_layers=1, block_size=4),
                                                 target.config, None))
    ids = greedy_sequences(target, count=2, prompt=5, answer=14)
    loss_mask = torch.tensor([[0] * 5 + [1] * 14] * 2)
    generators = [torch.Generator().manual_seed(i) for i in range(2)]
    anchors, real = train.batch_anchors(loss_mask, 4, generators)
    batch = train.MicroBatch(ids, loss_mask, anchors, real)
    features, last_hidden = train.target_features(target, ids, drafter.config, last_hidden=True)
    assert torch.equal(features, train.target_features(target, ids, drafter.config))
    with torch.no_grad():
        logits = target.logits(last_hidden)  # (2, S, vocab)
        top2 = logits[:, 4:-1].topk(2, dim=-1).values  # each answer token's predicting position
        assert torch.equal(logits[:, 4:-1].argmax(-1), ids[:, 5:])  # greedy: x_p = argmax at p - 1
    sharpening = 60.0 / (top2[..., 0] - top2[..., 1]).min()  # the runner-up e^-60 below, or less
    weights = train.slot_weights(4, 2.0)
    common = dict(config=drafter.config, weights=weights, loss_chunk_size=5)
    hard, *hard_counts = train.drafter_loss(target, drafter, features, batch, **common)
    distilled, *counts = train.drafter_loss(target, drafter, features, batch, **common,
                                            target_hidden=sharpening * last_hidden)
    torch.testing.assert_close(distilled, hard, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(counts, hard_counts))
    shifted = torch.cat([last_hidden[:, 1:], last_hidden[:, -1:]], dim=1)  # p's output, not p - 1's
    wrong, *_ = train.drafter_loss(target, drafter, features, batch, **common,
                                   target_hidden=sharpening * shifted)
    assert (wrong - hard).abs() > 0.1  # another token each slot: another loss


def test_in_drafter_loss_the_chunked_loss_equals_the_dense_one():
    torch.manual_seed(0)
    target = Qwen3.from_pretrained(TINY)
    drafter = Drafter(train.build_drafter_config(train.TrainConfig(drafter_layers=1, block_size=4),
                                                 target.config, None))
    ids = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(4))
    loss_mask = torch.tensor([[0] * 6 + [1] * 14, [0] * 9 + [1] * 11])
    anchors, real = train.batch_anchors(loss_mask, 5, [torch.Generator().manual_seed(i)
                                                       for i in range(2)])
    batch = train.MicroBatch(ids, loss_mask, anchors, real)
    features, last_hidden = train.target_features(target, ids, drafter.config, last_hidden=True)
    results = []
    for chunk_size in (0, 3):
        loss, *_ = train.drafter_loss(target, drafter, features, batch, config=drafter.config,
                                      weights=train.slot_weights(4, 2.0),
                                      loss_chunk_size=chunk_size, target_hidden=last_hidden,
                                      distill_weight=0.7)
        drafter.zero_grad()
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in drafter.parameters()]))
    (dense, dense_grads), (chunked, grads) = results
    torch.testing.assert_close(chunked, dense, rtol=1e-6, atol=1e-6)
    for got, expected in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ runs of train.py


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """make_data.py's JSONL and its packed folder: the tiny target's answers to 8 random prompts."""
    folder = tmp_path_factory.mktemp("made")
    generator = torch.Generator().manual_seed(0)
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_ids": torch.randint(0, 512, (4 + i,), generator=generator).tolist()})
        + "\n" for i in range(8)))
    jsonl, packed = folder / "data.jsonl", folder / "packed"
    assert make_data.main(["--target", str(TINY), "--prompts", str(folder / "prompts.jsonl"),
                           "--out", str(jsonl), "--max-new-tokens", "16", "--device", "cpu",
                           "--pack", str(packed)]) == 0
    return jsonl, packed


def train_argv(data: Path, out: Path, *extra: str, steps: int = 6, batch_size: int = 4) -> list:
    return ["--target", str(TINY), "--data", str(data), "--out", str(out), "--drafter-layers",
            "1", "--block-size", "4", "--num-anchors", "4", "--batch-size", str(batch_size),
            "--steps", str(steps), "--log-every", "1", "--device", "cpu", "--threads", "1",
            "--distill-weight", "1", *extra]


def weights_of(out: Path) -> dict:
    return load_file(out / "model.safetensors")


def test_a_distilling_run_trains_and_resumes_to_the_uninterrupted_result(made, tmp_path):
    jsonl, _ = made
    assert train.main(train_argv(jsonl, tmp_path / "straight", "--lr", "3e-3", steps=16)) == 0
    log = [json.loads(line) for line in (tmp_path / "straight" / "train_log.jsonl").read_text()
           .splitlines()]
    first, last = sum(r["loss"] for r in log[:3]) / 3, sum(r["loss"] for r in log[-3:]) / 3
    assert last < 0.8 * first  # KL(target || drafter) falls
    split = tmp_path / "split"
    assert train.main(train_argv(jsonl, split, "--lr", "3e-3", "--stop-at", "7", steps=16)) == 0
    assert train.main(train_argv(jsonl, split, "--lr", "3e-3", "--resume", steps=16)) == 0
    straight, resumed = weights_of(tmp_path / "straight"), weights_of(split)
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_a_resume_with_another_distill_weight_is_refused(made, tmp_path, capsys):
    jsonl, _ = made
    assert train.main(train_argv(jsonl, tmp_path, "--stop-at", "1")) == 0
    error = one_error_line(capsys, train_argv(jsonl, tmp_path, "--resume", "--distill-weight", "0"))
    assert "distill_weight was 1.0, now 0.0" in error
    assert "--distill-weight" in one_error_line(capsys, train_argv(jsonl, tmp_path / "b",
                                                                   "--distill-weight", "1.5"))


def test_distilling_from_packed_data_trains_the_jsonl_drafter(made, tmp_path):
    jsonl, packed = made
    assert train.main(train_argv(jsonl, tmp_path / "jsonl", steps=3)) == 0
    assert train.main(train_argv(packed, tmp_path / "packed", steps=3)) == 0
    expected, got = weights_of(tmp_path / "jsonl"), weights_of(tmp_path / "packed")
    assert all(torch.equal(expected[name], got[name]) for name in expected)


@pytest.mark.parametrize("sharding", [(), ("--fsdp",)], ids=["DDP", "FSDP2"])
def test_distilling_on_two_processes_trains_the_one_process_drafter(made, tmp_path, sharding):
    """The target is whole on every process, so each distils its own share of the global batch."""
    jsonl, _ = made
    assert train.main(train_argv(jsonl, tmp_path / "one", steps=4)) == 0
    two_processes(train_argv(jsonl, tmp_path / "two", *sharding, steps=4, batch_size=2))
    alone, shared = weights_of(tmp_path / "one"), weights_of(tmp_path / "two")
    for name in alone:
        torch.testing.assert_close(shared[name], alone[name], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ memory at Qwen3's vocabulary


MEMORY_PROBE = """
import sys, torch
from dflash.train_kernels import chunked_lm_head_loss
slots, vocab = 512, 151_936
generator = torch.Generator().manual_seed(0)
hidden = torch.randn(slots, 64, generator=generator, requires_grad=True)
head, teacher = torch.randn(vocab, 64, generator=generator) / 8, torch.randn(slots, 64)
labels, weights = torch.randint(0, vocab, (slots,)), torch.full((slots,), 1 / slots)
distilling = {"teacher": teacher} if sys.argv[1] == "distill" else {}
def status(field):  # kB, from /proc/self/status
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark restarts from now
    refs.write("5")
before = status("VmRSS")
chunked_lm_head_loss(hidden, head, labels, weights, 128, **distilling)[0].backward()
print((status("VmHWM") - before) / 1024)
"""


def test_distilling_holds_three_chunks_of_logits_at_most():
    """At vocabulary 151,936 a chunk of 128 slots' float32 logits is 74 MiB: distilling holds the
    drafter's, the target's log-probabilities and its probabilities, never a chunk's more nor the
    whole (512, vocab) (297 MiB a tensor); the hard labels' loss holds one chunk's logits."""
    chunk_mib = 128 * 151_936 * 4 / 2**20
    peaks = {}
    for loss in ("hard", "distill"):
        result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, loss], cwd=ROOT,
                                capture_output=True, text=True, timeout=300,
                                env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                     "PYTHONPATH": str(ROOT)})
        assert result.returncode == 0, result.stderr[-2000:]
        peaks[loss] = float(result.stdout.strip().splitlines()[-1])
    assert 0.7 * chunk_mib < peaks["hard"] < 1.5 * chunk_mib, peaks  # the probe measures
    assert peaks["distill"] < 3.5 * chunk_mib, peaks
