"""What a run keeps and measures besides its newest checkpoint (issue 41): a held-out split never
trained on, its loss and per-slot accuracy in the log; the last --keep checkpoints and the best
one by held-out loss, a half-written one never picked; and cuts that say what they removed, from
the answer's end or the prompt's start."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
from dflash import data, kept_checkpoints, training
from dflash.kept_checkpoints import BEST, CHECKPOINTS, kept_steps

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"


def records(count: int = 10, seed: int = 0) -> list[dict]:
    """Random sequences of several lengths: a prompt of 6, then the answer."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [12 + (5 * i) % 11 for i in range(count)]
    return [{"input_ids": torch.randint(0, 512, (n,), generator=generator).tolist(),
             "loss_mask": [0] * 6 + [1] * (n - 6)} for n in lengths]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def argv(data_path: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(TINY), "--data", str(data_path), "--out", str(out),
            "--drafter-layers", "1", "--block-size", "4", "--num-anchors", "4", "--batch-size", "2",
            "--steps", "10", "--log-every", "1", "--device", "cpu", "--threads", "1", *extra]


def log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "data.jsonl", records())


# ------------------------------------------------------------------ the held-out split


def test_the_split_is_a_fixed_draw_the_same_from_jsonl_and_packed_data(jsonl, tmp_path):
    packed = tmp_path / "packed"
    data.pack(jsonl, packed, 512, {})
    splits = [data.split_heldout(data.load_sequences(path, 1000, 512), 3)
              for path in (jsonl, packed, jsonl)]
    for (train_part, held), (train_again, held_again) in zip(splits, splits[1:]):
        assert held.starts.tolist() == held_again.starts.tolist()
        assert train_part.starts.tolist() == train_again.starts.tolist()
    trained, held = splits[0]
    assert len(held.starts) == 3 and len(trained.starts) == 7
    assert not set(held.starts.tolist()) & set(trained.starts.tolist())
    assert data.split_heldout(data.load_sequences(jsonl, 1000, 512), 0)[1] is None
    with pytest.raises(data.UsageError, match="--heldout 10: the data has only 10"):
        data.split_heldout(data.load_sequences(jsonl, 1000, 512), 10)


def test_held_out_sequences_are_never_trained_on(jsonl, tmp_path):
    """Holding 3 out trains the drafter a file of the other 7, in their order, trains."""
    sequences = data.load_sequences(jsonl, 1000, 512)
    _, held = data.split_heldout(sequences, 3)
    rest = [row for row, start in zip(records(), sequences.starts.tolist())
            if start not in held.starts.tolist()]
    assert train.main(argv(jsonl, tmp_path / "held", "--heldout", "3")) == 0
    assert train.main(argv(write_jsonl(tmp_path / "rest.jsonl", rest), tmp_path / "rest")) == 0
    assert same_weights(tmp_path / "held", tmp_path / "rest")


def test_the_logged_figures_are_the_training_loss_over_the_held_out_sequences(jsonl, tmp_path):
    """Recomputed one sequence at a time from the saved drafter: the loss is the weighted mean over
    every held-out slot (each sequence's mean weighted by its slots' weight), the accuracy is per
    slot; the same anchors at every evaluation, so an unchanged drafter logs the same figures."""
    out, repeated = tmp_path / "run", write_jsonl(tmp_path / "twice.jsonl", records(2) * 5)
    assert train.main(argv(repeated, out, "--heldout", "5", "--batch-size", "3", "--lr", "1e-2",
                           "--eval-every", "20")) == 0  # held out: copies of trained sequences
    figures = [r for r in log(out) if "heldout_loss" in r]
    assert [r["step"] for r in figures] == [10] and max(figures[0]["heldout_slot_accuracy"]) > 0
    saved = training.load_training_state(out / "training_state.pt")["train_config"]
    cfg = train.TrainConfig(**{**saved, "resume": True})
    run = train.start_run(cfg, training.Distributed())
    loss_sum, weight_sum = 0.0, 0.0
    correct, counted = torch.zeros(4), torch.zeros(4)
    for i in range(len(run.heldout.starts)):
        batch = train.micro_batch(run.heldout, [i], 0, cfg, "cpu")
        weight = train.label_weights(train.block_labels(*batch, 4), run.slot_weights).sum()
        with torch.no_grad():
            loss, hits, slots = train.batch_loss(run, batch, None)
        loss_sum, weight_sum = loss_sum + loss.item() * weight.item(), weight_sum + weight.item()
        correct, counted = correct + hits, counted + slots
    assert figures[0]["heldout_loss"] == pytest.approx(loss_sum / weight_sum, rel=1e-5)
    assert figures[0]["heldout_slot_accuracy"] == pytest.approx(
        (correct[1:] / counted[1:]).tolist(), abs=1e-4)
    assert train.heldout_figures(run) == train.heldout_figures(run)  # anchors drawn alike


def test_the_held_out_option_counts_on_resume(jsonl, tmp_path, capsys):
    assert train.main(argv(jsonl, tmp_path, "--heldout", "2", "--stop-at", "3")) == 0
    assert train.main(argv(jsonl, tmp_path, "--heldout", "3", "--resume")) == 2
    assert "heldout was 2, now 3" in capsys.readouterr().err
    assert train.main(argv(jsonl, tmp_path, "--heldout", "2", "--resume", "--keep", "2")) == 0


# ------------------------------------------------------------------ kept checkpoints and best/


def test_keep_holds_the_last_checkpoints_and_a_resume_picks_the_newest(jsonl, tmp_path):
    straight, out = tmp_path / "straight", tmp_path / "stopped"
    assert train.main(argv(jsonl, straight, "--save-every", "2", "--keep", "3")) == 0
    assert [step for step, _ in kept_steps(straight)] == [6, 8, 10]
    for step, folder in kept_steps(straight):
        assert training.load_training_state(folder / "training_state.pt")["step"] == step
    assert same_weights(straight, straight / CHECKPOINTS / "step-00000010")
    assert train.main(argv(jsonl, out, "--save-every", "2", "--stop-at", "7", "--keep", "2")) == 0
    assert [step for step, _ in kept_steps(out)] == [6, 7]
    assert train.main(argv(jsonl, out, "--auto-resume", "--save-every", "2", "--keep", "2")) == 0
    assert [step for step, _ in kept_steps(out)] == [8, 10] and same_weights(out, straight)
    assert train.main(argv(jsonl, out, "--force", "--steps", "2", "--keep", "1")) == 0
    assert not (out / CHECKPOINTS).exists()  # --force: a new run, keeping only its newest


def test_a_half_written_checkpoint_is_never_picked(jsonl, tmp_path, capsys):
    """A crash while a kept copy was written leaves `step-N.partial`: never resumed from (even if
    newer and whole) and removed on the next start. A training state that cannot be read is passed
    over, with a note, for the newest complete one kept."""
    straight, out = tmp_path / "straight", tmp_path / "crashed"
    assert train.main(argv(jsonl, straight, "--save-every", "2", "--keep", "5")) == 0
    assert train.main(argv(jsonl, out, "--save-every", "2", "--keep", "5", "--stop-at", "6")) == 0
    other = tmp_path / "other"  # a newer, whole state of another run: refused if it were picked
    assert train.main(argv(jsonl, other, "--seed", "1", "--save-every", "2", "--keep", "5")) == 0
    shutil.copytree(other / CHECKPOINTS / "step-00000008",
                    out / CHECKPOINTS / "step-00000008.partial")
    state, whole = out / "training_state.pt", (out / "training_state.pt").read_bytes()
    state.unlink()  # a new file, not the kept copy's (a hard link to the same one)
    state.write_bytes(whole[:1000])  # cut short, as a copy of the folder stopped midway leaves it
    path, saved = training.newest_training_state(out)
    assert path == out / CHECKPOINTS / "step-00000006" / "training_state.pt" and saved["step"] == 6
    capsys.readouterr()
    assert train.main(argv(jsonl, out, "--save-every", "2", "--keep", "5", "--resume")) == 0
    assert "resuming from an older checkpoint" in capsys.readouterr().err
    assert same_weights(out, straight)
    assert not (out / CHECKPOINTS / "step-00000008.partial").exists()


def test_best_keeps_the_checkpoint_of_the_lowest_held_out_loss(jsonl, tmp_path):
    """Saved at its step even where no save was due, kept whole when later ones are deleted."""
    out = tmp_path / "run"
    assert train.main(argv(jsonl, out, "--heldout", "3", "--eval-every", "1", "--keep", "1",
                           "--lr", "3e-2", "--steps", "8")) == 0
    losses = {r["step"]: r["heldout_loss"] for r in log(out) if "heldout_loss" in r}
    assert sorted(losses) == list(range(1, 9))
    best = min(losses, key=losses.get)
    assert json.loads((out / BEST / "best.json").read_text()) == {"step": best,
                                                                  "heldout_loss": losses[best]}
    assert training.load_training_state(out / BEST / "training_state.pt")["step"] == best
    assert train.main(argv(jsonl, tmp_path / "until", "--heldout", "3", "--steps", "8",
                           "--lr", "3e-2", "--stop-at", str(best))) == 0
    assert same_weights(out / BEST, tmp_path / "until")


def test_a_crash_while_best_is_replaced_leaves_the_old_best(tmp_path):
    """Between `put_in_place`'s renames, the old best is aside and the new one `.partial`: the next
    start puts the old one back and removes the unfinished one."""
    for name in ("state", "weights"):
        (tmp_path / name).write_text(name)
    kept_checkpoints.keep_best(tmp_path, 3, 1.5, ("state", "weights"))
    os.replace(tmp_path / BEST, tmp_path / f"{BEST}.old")
    (tmp_path / f"{BEST}.partial").mkdir()
    kept_checkpoints.remove_unfinished(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == [BEST, "state", "weights"]
    assert kept_checkpoints.best_loss(tmp_path) == 1.5
    kept_checkpoints.keep_best(tmp_path, 5, 0.5, ("state", "weights"))
    assert json.loads((tmp_path / BEST / "best.json").read_text()) == {"step": 5,
                                                                      "heldout_loss": 0.5}
    assert sorted(path.name for path in (tmp_path / BEST).iterdir()) == ["best.json", "state",
                                                                          "weights"]


# ------------------------------------------------------------------ cuts


CUT_ROWS = [{"input_ids": list(range(1, 17)), "loss_mask": [0] * 10 + [1] * 6},  # prompt 10
            {"input_ids": list(range(1, 25)), "loss_mask": [0] * 4 + [1] * 20},  # answer 20
            {"input_ids": list(range(1, 9)), "loss_mask": [0] * 2 + [1] * 6}]  # short: kept whole


@pytest.mark.parametrize("form", ["jsonl", "packed"])
def test_a_cut_says_what_it_removed_from_either_end(tmp_path, form):
    """To 12 tokens: the answer's end goes (4 + 12 answer tokens), or the prompt's start first (4
    prompt tokens, then 4 and 8 more from the ends: the second's answer is longer than the
    limit)."""
    path = write_jsonl(tmp_path / "cut.jsonl", CUT_ROWS)
    if form == "packed":
        data.pack(path, tmp_path / "packed", 512, {})
        path = tmp_path / "packed"
    end, start = (data.load_sequences(path, 12, 512, cut=cut) for cut in data.CUTS)
    assert (end.starts.tolist(), end.lengths.tolist()) == ([0, 16, 40], [12, 12, 8])
    assert (end.cut, end.tokens_dropped, end.answer_tokens_dropped) == (2, 16, 16)
    assert (start.starts.tolist(), start.lengths.tolist()) == ([4, 20, 40], [12, 12, 8])
    assert (start.cut, start.tokens_dropped, start.answer_tokens_dropped) == (2, 16, 8)
    row = slice(start.starts[0], start.starts[0] + start.lengths[0])
    assert start.loss_mask[row].tolist() == [0] * 6 + [1] * 6  # the whole answer kept
    assert data.cut_note(start, 12, 12, "prompt-start") == (
        "note: 2 sequence(s) longer than 12 tokens (--max-seq-len) were cut at the prompt's start "
        "(then the end) (--cut prompt-start): 16 tokens left out, 8 of them answer tokens")


def test_a_prompt_start_cut_keeps_a_sequence_an_end_cut_would_drop(tmp_path, capsys):
    """A prompt longer than the limit: cut at the end, no answer is left (the sequence is dropped
    and said to be); cut at the prompt's start, the answer trains."""
    rows = [{"input_ids": list(range(1, 31)), "loss_mask": [0] * 24 + [1] * 6}] + records(4)
    path = write_jsonl(tmp_path / "long_prompt.jsonl", rows)
    assert len(data.load_sequences(path, 20, 512).starts) == 4
    assert len(data.load_sequences(path, 20, 512, cut="prompt-start").starts) == 5
    assert train.main(argv(path, tmp_path / "end", "--max-seq-len", "20", "--steps", "1")) == 0
    assert "1 sequence(s) with no block left out" in capsys.readouterr().err
    assert train.main(argv(path, tmp_path / "start", "--max-seq-len", "20", "--steps", "1",
                           "--cut", "prompt-start")) == 0
    assert "--cut prompt-start): 12 tokens left out, 0 of them answer tokens" in \
        capsys.readouterr().err


def test_auto_resume_resumes_from_a_kept_checkpoint_alone(tmp_path):
    """--auto-resume resumes where a complete checkpoint is kept, even with none in --out itself
    (removed by hand), and starts over where only a `.partial` one is."""
    config = train.TrainConfig(target=str(TINY), data="data.jsonl", out=str(tmp_path),
                               auto_resume=True)
    kept = tmp_path / CHECKPOINTS / "step-00000004.partial"
    kept.mkdir(parents=True)
    (kept / "training_state.pt").write_bytes(b"")
    started = train.starting_or_resuming(config)
    assert (started.resume, started.force) == (False, True)
    kept.rename(tmp_path / CHECKPOINTS / "step-00000004")
    resumed = train.starting_or_resuming(config)
    assert (resumed.resume, resumed.force) == (True, False)
