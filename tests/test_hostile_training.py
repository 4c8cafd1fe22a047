"""train.py and make_data.py against what a hostile pass tried (issue 50): nothing deleted before
every input is checked, no output written over (or into) an input, a folder emptied only when it
carries the program's mark, side files and packed data read with suspicion, the operating
system's refusals and Ctrl-C in one line, and numbers range-checked where they are parsed."""

import errno
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import make_data
import train
from dflash import cli, data, kept_checkpoints, training
from dflash.cli import UsageError
from tests.snapshots import assert_untouched, tree_bytes

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHAPE = ["--drafter-layers", "1", "--block-size", "4"]  # a new drafter's; --init-from: its own
TRAIN = [*SHAPE, "--num-anchors", "4", "--batch-size", "2", "--steps", "1", "--device", "cpu"]
RECIPE = TRAIN[len(SHAPE):]


def records(count: int = 6, length: int = 14, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    return "".join(json.dumps({"input_ids": torch.randint(0, 512, (length,),
                                                          generator=generator).tolist(),
                               "loss_mask": [0] * 4 + [1] * (length - 4)}) + "\n"
                   for _ in range(count))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A copy of the tiny target (a refusal that failed would delete it, not the repository's),
    a drafter for it, data (JSONL and packed), prompts, and a run folder trained one step."""
    root = tmp_path_factory.mktemp("world")
    places = {"target": root / "target", "drafter": root / "drafter", "data": root / "d.jsonl",
              "packed": root / "packed", "prompts": root / "prompts.jsonl", "run": root / "run"}
    shutil.copytree(FIXTURES / "qwen3-tiny", places["target"])
    places["data"].write_text(records())
    data.pack(places["data"], places["packed"], 512, {})
    places["prompts"].write_text("".join(json.dumps({"prompt_ids": [5 + i, 9, 11]}) + "\n"
                                         for i in range(3)))
    assert train.main(["--target", str(places["target"]), "--data", str(places["data"]),
                       "--out", str(places["run"]), *TRAIN]) == 0
    places["drafter"].mkdir()
    for name in ("config.json", "model.safetensors"):  # the run's drafter, as --init-from takes it
        shutil.copy(places["run"] / name, places["drafter"] / name)
    return places


def one_error_line(capsys, main, argv: list[str], status: int = 2) -> str:
    """Run a program; it must end with `status` and one `error:` line. Returns the line."""
    capsys.readouterr()
    try:
        got = main(argv)
    except SystemExit as exit:
        got = exit.code
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if not re.match(r"\s*\d+%\|", line)]  # a progress bar's, where work had started
    assert got == status and len(lines) == 1 and lines[0].startswith("error: "), (got, lines)
    return lines[0]


@pytest.fixture
def no_step(monkeypatch):
    """A refusal must come before the first step."""
    def started(*args, **kwargs):
        raise AssertionError("a step started before the input was refused")

    monkeypatch.setattr(train, "drafter_loss", started)


def broken(tmp: Path, name: str, world: dict[str, Path]) -> Path:
    """A bad input of the kind `name`, made in `tmp`."""
    if name == "bad line":
        path = tmp / "bad.jsonl"
        path.write_text(records(3) + '{"input_ids": [1, true], "loss_mask": [0, 1]}\n')
        return path
    if name == "nan drafter":
        shutil.copytree(world["drafter"], tmp / "nan")
        weights = load_file(tmp / "nan" / "model.safetensors")
        first = sorted(weights)[0]
        weights[first] = torch.full_like(weights[first], float("nan"))
        save_file(weights, tmp / "nan" / "model.safetensors", metadata={"format": "pt"})
        return tmp / "nan"
    if name == "swapped offsets":
        shutil.copytree(world["packed"], tmp / "swapped")
        offsets = np.fromfile(tmp / "swapped" / "offsets.bin", dtype=np.int64)
        offsets[[1, 2]] = offsets[[2, 1]]
        offsets.tofile(tmp / "swapped" / "offsets.bin")
        return tmp / "swapped"
    if name == "fifo":
        os.mkfifo(tmp / "fifo.jsonl")
        return tmp / "fifo.jsonl"
    raise KeyError(name)


# ------------------------------------------------------------------ check, then touch


def train_cases(tmp: Path, world: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """(train.py's arguments, a fragment of its refusal) for each bad input."""
    w = {name: str(path) for name, path in world.items()}
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (foreign / "model.safetensors").write_bytes(b"my weights")
    boxed = tmp / "box" / "d.jsonl"
    boxed.parent.mkdir()
    shutil.copy(world["data"], boxed)
    unstarted = tmp / "unstarted"  # a run killed before its first save: a log, no state
    unstarted.mkdir()
    (unstarted / training.LOG_FILE).write_text('{"step": 1}\n')
    return {
        "bad data, --force": (["--data", str(broken(tmp, "bad line", world)), "--out", w["run"],
                               "--force"], "input_ids must be integers"),
        "bad data, --auto-resume with no state": (["--data", str(tmp / "bad.jsonl"), "--out",
                                                   str(unstarted), "--auto-resume"],
                                                  "input_ids must be integers"),
        "packed offsets swapped, --force": (["--data", str(broken(tmp, "swapped offsets", world)),
                                            "--out", w["run"], "--force"], "offsets.bin"),
        "a FIFO as --data": (["--data", str(broken(tmp, "fifo", world)), "--out", w["run"],
                              "--force"], "not a regular file"),
        "NaN --init-from, --force": (["--init-from", str(broken(tmp, "nan drafter", world)),
                                      "--out", w["run"], "--force"], "NaN"),
        "--out is --target": (["--out", w["target"], "--force"], "is --target"),
        "--out is --init-from": (["--init-from", w["drafter"], "--out", w["drafter"], "--force"],
                                 "is --init-from"),
        "--out is the packed --data": (["--data", w["packed"], "--out", w["packed"], "--force"],
                                       "is --data"),
        "--out inside --target": (["--out", str(world["target"] / "run")], "lies inside --target"),
        "--out holds --data": (["--data", str(boxed), "--out", str(boxed.parent), "--force"],
                               "holds --data"),
        "a foreign folder, --force": (["--out", str(foreign), "--force"],
                                      "holds notes.txt, not a run folder"),
        "a foreign folder, --auto-resume": (["--out", str(foreign), "--auto-resume"],
                                            "holds notes.txt, not a run folder"),
    }


def make_data_cases(tmp: Path, world: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """(make_data.py's arguments, a fragment of its refusal) for each bad input."""
    w = {name: str(path) for name, path in world.items()}
    foreign = tmp / "foreign-pack"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    no_user = tmp / "no-user.jsonl"
    no_user.write_text(json.dumps({"messages": [{"role": "system", "content": "be brief"}]}) + "\n")
    return {
        "--out is --prompts": (["--out", w["prompts"]], "--out"),
        "--out inside --target": (["--out", str(world["target"] / "d.jsonl")],
                                  "lies inside --target"),
        "--pack onto --target": (["--out", str(tmp / "new.jsonl"), "--pack", w["target"]],
                                 "--pack"),
        "--pack holds --out": (["--out", str(tmp / "box" / "d.jsonl"), "--pack", str(tmp / "box")],
                               "lies inside --pack"),
        "--pack into a foreign folder": (["--out", str(tmp / "new.jsonl"), "--pack", str(foreign)],
                                         "holds notes.txt, not a packed folder"),
        "a chat record with no user turn": (["--prompts", str(no_user), "--out",
                                             str(tmp / "new.jsonl")],
                                            f"{no_user}:1: the conversation has no user turn"),
    }


def test_no_training_program_touches_anything_on_bad_input(world, tmp_path, capsys, no_step):
    """Each bad input: one `error:` line, exit 2, and the run folder, the target, the drafter,
    the data (both forms) and the prompts byte for byte as they were, every folder made for the
    case too (a --force that emptied first and checked after would show here)."""
    watched = [*world.values(), tmp_path]
    (tmp_path / "t").mkdir()
    (tmp_path / "m").mkdir()
    cases = {("train.py", name): (train.main, ["--target", str(world["target"]), "--data",
                                               str(world["data"]), *RECIPE, *argv,
                                               *([] if "--init-from" in argv else SHAPE)], fragment)
             for name, (argv, fragment) in train_cases(tmp_path / "t", world).items()}
    cases.update({("make_data.py", name): (make_data.main, ["--target", str(world["target"]),
                                                            "--prompts", str(world["prompts"]),
                                                            "--max-new-tokens", "4",
                                                            "--device", "cpu", *argv], fragment)
                  for name, (argv, fragment) in make_data_cases(tmp_path / "m", world).items()})
    for (program, name), (main, argv, fragment) in cases.items():
        before = tree_bytes(*watched)
        line = one_error_line(capsys, main, argv)
        assert fragment in line, (program, name, line)
        assert_untouched(before, *watched)


def test_force_over_a_run_folder_keeps_what_is_not_the_runs(world, tmp_path):
    """The mark is there (a training state): --force removes the run's files, never a user's."""
    out = tmp_path / "run"
    shutil.copytree(world["run"], out)
    (out / "notes.txt").write_text("mine")
    assert train.main(["--target", str(world["target"]), "--data", str(world["data"]), "--out",
                       str(out), *TRAIN, "--force"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / training.STATE_FILE).is_file()


def test_the_path_rule_resolves_links_and_never_compares_strings(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(UsageError, match="is --target"):
        cli.refuse_overlap({"--out": tmp_path / "link"}, {"--target": tmp_path / "target"})
    with pytest.raises(UsageError, match="lies inside --target"):
        cli.refuse_overlap({"--out": tmp_path / "link" / ".." / "target" / "x"},
                            {"--target": tmp_path / "target"})
    cli.refuse_overlap({"--out": tmp_path / "target2", "--pack": None},  # a prefix, not a parent
                        {"--target": tmp_path / "target", "--tokenizer": None})


# ------------------------------------------------------------------ side files


@pytest.mark.parametrize("content, fragment", [
    (b"\xff\xfe host 12", "cannot read the lock file"),
    (b"hello world", "not a lock of train.py"),
    (b"host -5", "not a lock of train.py"),
])
def test_a_lock_that_is_not_ours_is_refused_in_one_line(tmp_path, content, fragment):
    lock = tmp_path / training.LOCK_FILE
    lock.write_bytes(content)
    with pytest.raises(UsageError, match=fragment):
        training.take_lock(lock)
    assert lock.read_bytes() == content


def test_a_lock_that_is_a_fifo_or_empty(tmp_path):
    """A FIFO would hang the read: refused. An empty lock is a crash between its creation and its
    line: replaced."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UsageError, match="not a regular file"):
        training.take_lock(tmp_path / "fifo")
    lock = tmp_path / training.LOCK_FILE
    lock.write_text("")
    assert training.take_lock(lock) and lock.read_text().split()[1] == str(os.getpid())


def test_the_log_read_on_resume_is_a_side_file(tmp_path):
    log = tmp_path / training.LOG_FILE
    log.write_text('{"step": 1}\n{"step": true}\n')
    with pytest.raises(UsageError, match=f"{log}:2: no integer 'step'"):
        training.forget_log_after(log, 1)
    log.write_bytes(b'{"step": 1}\n\xff\n')
    with pytest.raises(UsageError, match="cannot read the training log"):
        training.forget_log_after(log, 1)
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(UsageError, match="not a regular file"):
        training.forget_log_after(log, 1)
    with pytest.raises(UsageError, match="training log is not a regular file"):
        training.prepare_run_folder(tmp_path, resume=True, force=False, outputs=())


@pytest.mark.parametrize("record", ['{"heldout_loss": NaN}', '{"heldout_loss": "1.5"}', "[1]",
                                    '{"heldout_loss": 1.5'])
def test_a_bad_best_record_counts_as_none_with_a_note(tmp_path, capsys, record):
    (tmp_path / kept_checkpoints.BEST).mkdir()
    (tmp_path / kept_checkpoints.BEST / kept_checkpoints.BEST_RECORD).write_text(record)
    assert kept_checkpoints.best_loss(tmp_path) is None
    assert capsys.readouterr().err.startswith("note: ")


# ------------------------------------------------------------------ packed data, checked


def edited_pack(world: dict[str, Path], tmp_path: Path, edit) -> Path:
    """A copy of the packed data, `edit(folder)` applied."""
    folder = tmp_path / "packed"
    shutil.copytree(world["packed"], folder)
    edit(folder)
    return folder


def rewrite(name: str, dtype, change):
    def edit(folder: Path):
        values = np.fromfile(folder / f"{name}.bin", dtype=dtype)
        change(values)
        values.tofile(folder / f"{name}.bin")
    return edit


def manifest_edit(change):
    def edit(folder: Path):
        manifest = json.loads((folder / data.MANIFEST).read_text())
        change(manifest)
        (folder / data.MANIFEST).write_text(json.dumps(manifest))
    return edit


@pytest.mark.parametrize("edit, fragment", [
    (rewrite("offsets", np.int64, lambda o: o.__setitem__(1, o[2])), None),  # not rising
    (rewrite("offsets", np.int64, lambda o: o.__setitem__(0, 1)), "rise from 0"),
    (rewrite("offsets", np.int64, lambda o: o.__setitem__(-1, o[-1] - 1)), "rise from 0"),
    (rewrite("first_anchor", np.int64, lambda a: a.fill(0)), "first_anchor.bin says 0"),
    (rewrite("loss_mask", np.uint8, lambda m: m.__setitem__(-1, 7)), "loss mask value 7"),
    (rewrite("tokens", np.uint32, lambda t: t.__setitem__(3, 100000)), "token id 100000"),
    (rewrite("tokens", np.uint32, lambda t: t.__setitem__(3, t[3] ^ 1)), "sha256"),
    (manifest_edit(lambda m: m.__setitem__("sequences", True)), "sequences must be an integer"),
    (manifest_edit(lambda m: m.__setitem__("largest_token_id", "7")), "token id 7"),
])
def test_packed_data_is_checked_when_opened(world, tmp_path, edit, fragment):
    """Offsets out of order, first anchors all zero, ids past the vocabulary, mask bytes of 7,
    a changed token or a manifest of strings: each one error naming the folder."""
    folder = edited_pack(world, tmp_path, edit)
    with pytest.raises(UsageError, match=fragment or "offsets|first_anchor") as refusal:
        data.load_sequences(folder, 1000, 512)
    assert str(folder) in str(refusal.value)


def test_a_manifest_without_a_hash_is_hashed_on_open(world, tmp_path):
    folder = edited_pack(world, tmp_path, manifest_edit(lambda m: m.pop("sha256")))
    assert data.load_sequences(folder, 1000, 512).sha256 == \
        data.load_sequences(world["data"], 1000, 512).sha256


def test_each_batch_is_checked_as_it_is_read(world):
    """A file changed under a running run: the batch names it, not the embedding."""
    sequences = data.load_sequences(world["data"], 1000, 512)
    tokens = sequences.tokens.copy()
    tokens[sequences.starts[2]] = 600
    cfg = train.TrainConfig(num_anchors=4, block_size=4)
    with pytest.raises(UsageError, match=f"{world['data']}: sequence 2: token id 600"):
        train.micro_batch(sequences._replace(tokens=tokens), [1, 2], 0, cfg, "cpu")
    mask = sequences.loss_mask.copy()
    mask[sequences.starts[1]] = 7
    with pytest.raises(UsageError, match="sequence 1: loss mask value 7"):
        train.micro_batch(sequences._replace(loss_mask=mask), [1, 2], 0, cfg, "cpu")


def test_booleans_are_not_token_ids(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(records(2) + '{"input_ids": [1, true, 3], "loss_mask": [0, 1, 1]}\n')
    with pytest.raises(UsageError, match=f"{path}:3: input_ids must be integers"):
        data.load_sequences(path, 1000, 512)


# ------------------------------------------------------------------ the OS, and Ctrl-C


def make_data_argv(world: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out",
            str(out), "--max-new-tokens", "4", "--batch-size", "1", "--device", "cpu", *extra]


def test_a_full_disk_under_make_data_is_one_line_and_no_partial_record(world, tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "new" / "d.jsonl"
    real, calls = make_data.write_all, []

    def fills_up(file, payload: bytes):
        calls.append(1)
        if len(calls) % 2 == 0:  # every second batch: half its bytes, then no space
            real(file, payload[:len(payload) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(out))
        real(file, payload)

    monkeypatch.setattr(make_data, "write_all", fills_up)
    line = one_error_line(capsys, make_data.main, make_data_argv(world, out))
    assert line == f"error: {out}: No space left on device"
    assert [json.loads(record)["index"] for record in out.read_text().splitlines()] == [0]
    def full(file, payload: bytes):
        raise OSError(errno.ENOSPC, "No space left on device", file.name)

    monkeypatch.setattr(make_data, "write_all", full)
    one_error_line(capsys, make_data.main, make_data_argv(world, tmp_path / "a" / "b.jsonl"))
    assert not (tmp_path / "a").exists()  # the first write failed: no file, no folder made for it


def test_a_full_disk_while_packing_leaves_the_old_pack(world, tmp_path, capsys, monkeypatch):
    packed = tmp_path / "packed"
    shutil.copytree(world["packed"], packed)
    before = tree_bytes(tmp_path)

    def fills_up(jsonl, partial, vocab_size, identity):
        (partial / "tokens.bin").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(partial / "tokens.bin"))

    monkeypatch.setattr(data, "write_packed", fills_up)
    out = tmp_path / "d.jsonl"
    shutil.copy(world["data"], out)
    before = tree_bytes(tmp_path)
    one_error_line(capsys, make_data.main, make_data_argv(world, out, "--pack", str(packed)))
    assert_untouched(before, tmp_path)


def test_ctrl_c_in_make_data_exits_130_with_whole_records(world, tmp_path, capsys, monkeypatch):
    real, calls = make_data.generate_batch, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(make_data, "generate_batch", interrupted)
    out = tmp_path / "d.jsonl"
    assert one_error_line(capsys, make_data.main, make_data_argv(world, out), 130) == \
        "error: interrupted (Ctrl-C)"
    assert [json.loads(record)["index"] for record in out.read_text().splitlines()] == [0]


def test_a_run_folder_moved_mid_run_is_one_line(world, tmp_path, capsys, monkeypatch):
    out, moved = tmp_path / "run", tmp_path / "moved"
    real = train.train_step

    def then_moved(run):
        result = real(run)
        if not moved.exists():
            out.rename(moved)
        return result

    monkeypatch.setattr(train, "train_step", then_moved)
    argv = ["--target", str(world["target"]), "--data", str(world["data"]), "--out", str(out),
            *TRAIN, "--steps", "2", "--log-every", "1"]
    line = one_error_line(capsys, train.main, argv)
    assert f"{out}: the run folder is gone" in line


# ------------------------------------------------------------------ ranges


@pytest.mark.parametrize("option, value", [("--head-dim", "3"), ("--head-dim", "0"),
                                           ("--gamma", "0"), ("--gamma", "1e-400"),
                                           ("--gamma", "nan")])
def test_shapes_and_decays_are_range_checked_when_parsed(capsys, option, value):
    line = one_error_line(capsys, train.main, ["--target", "t", "--data", "d", "--out", "o",
                                               option, value])
    assert option in line


def test_a_non_finite_init_from_is_refused_before_the_first_step(world, tmp_path, capsys,
                                                                 no_step):
    """Expected whichever checks first: this loader (per tensor, as it loads) or train.py's
    starting drafter; the refusal names the drafter and comes before any step."""
    drafter = broken(tmp_path, "nan drafter", world)
    line = one_error_line(capsys, train.main, ["--target", str(world["target"]), "--data",
                                               str(world["data"]), "--out", str(tmp_path / "o"),
                                               *RECIPE, "--init-from", str(drafter)])
    assert str(drafter) in line and ("NaN" in line or "finite" in line)
    assert not (tmp_path / "o").exists()
