"""The packed data format (dflash/data.py, `make_data.py --pack`): a flat token file train.py
memory-maps and reads a batch at a time, holding what the JSONL holds and training the same
drafter; a folder cut short, made by another target, or not packed at all is refused in one line."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import make_data
import train
from dflash import data

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """make_data.py's JSONL and its packed folder, for 7 random prompts to the tiny target."""
    folder = tmp_path_factory.mktemp("made")
    generator = torch.Generator().manual_seed(0)
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_ids": torch.randint(0, 512, (4 + i,), generator=generator).tolist()})
        + "\n" for i in range(7)))
    jsonl, packed = folder / "data.jsonl", folder / "packed"
    assert make_data.main(["--target", str(TINY), "--prompts", str(folder / "prompts.jsonl"),
                           "--out", str(jsonl), "--max-new-tokens", "16", "--device", "cpu",
                           "--pack", str(packed)]) == 0
    return jsonl, packed


def test_the_packed_folder_holds_the_jsonl_records_and_is_memory_mapped(made):
    jsonl, packed = made
    from_jsonl = data.load_sequences(jsonl, 1000, 512)
    from_packed = data.load_sequences(packed, 1000, 512)
    assert isinstance(from_packed.tokens, np.memmap) and isinstance(from_packed.loss_mask, np.memmap)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(from_packed.starts) == len(records) == 7
    for i, record in enumerate(records):
        row = slice(from_packed.starts[i], from_packed.starts[i] + from_packed.lengths[i])
        assert from_packed.tokens[row].tolist() == record["input_ids"]
        assert from_packed.loss_mask[row].tolist() == record["loss_mask"]
    assert from_packed.sha256 == from_jsonl.sha256  # the records' hash: either form resumes
    manifest = json.loads((packed / "manifest.json").read_text())
    assert manifest["sequences"] == 7 and manifest["target_config_sha256"] == data.content_hash(
        TINY / "config.json")


def test_cutting_and_dropping_match_between_the_forms(made):
    """Cut to 6 tokens: sequences whose answer starts late lose every block and are dropped."""
    jsonl, packed = made
    a, b = data.load_sequences(jsonl, 6, 512), data.load_sequences(packed, 6, 512)
    assert a.starts.tolist() == b.starts.tolist() and a.lengths.tolist() == b.lengths.tolist()
    assert (a.cut, a.tokens_dropped) == (b.cut, b.tokens_dropped) and a.cut == 7
    assert 0 < len(a.starts) < 7 and set(a.lengths.tolist()) == {6}


def train_argv(data_path: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(TINY), "--data", str(data_path), "--out", str(out), "--drafter-layers",
            "1", "--block-size", "4", "--num-anchors", "4", "--batch-size", "3", "--steps", "6",
            "--log-every", "1", "--device", "cpu", *extra]


def test_packed_data_trains_the_drafter_jsonl_trains_and_resumes_a_jsonl_run(made, tmp_path):
    jsonl, packed = made
    assert train.main(train_argv(jsonl, tmp_path / "jsonl")) == 0
    assert train.main(train_argv(packed, tmp_path / "packed")) == 0
    assert train.main(train_argv(jsonl, tmp_path / "both", "--stop-at", "3")) == 0
    assert train.main(train_argv(packed, tmp_path / "both", "--resume")) == 0
    expected = load_file(tmp_path / "jsonl" / "model.safetensors")
    for run in ("packed", "both"):
        got = load_file(tmp_path / run / "model.safetensors")
        assert all(torch.equal(expected[name], got[name]) for name in expected)


def one_error_line(capsys, arguments) -> str:
    capsys.readouterr()
    assert train.main(arguments) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_broken_or_foreign_packed_folder_is_refused_in_one_line(made, tmp_path, capsys):
    _, packed = made
    cut = tmp_path / "cut"
    shutil.copytree(packed, cut)
    with open(cut / "tokens.bin", "r+b") as tokens:
        tokens.truncate(8)
    assert "tokens.bin: missing, or not the" in one_error_line(capsys, train_argv(cut, tmp_path / "a"))
    foreign = tmp_path / "foreign"
    shutil.copytree(packed, foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    (foreign / "manifest.json").write_text(json.dumps({**manifest, "target_config_sha256": "0" * 64}))
    assert "made by another target" in one_error_line(capsys, train_argv(foreign, tmp_path / "b"))
    assert "data file not found" in one_error_line(capsys, train_argv(tmp_path / "missing",
                                                                      tmp_path / "c"))
    (tmp_path / "plain").mkdir()
    assert "packed data's manifest not found" in one_error_line(
        capsys, train_argv(tmp_path / "plain", tmp_path / "d"))


def test_packing_again_converts_a_complete_jsonl(made, tmp_path):
    """Run make_data.py again with --pack: nothing to answer, the JSONL is packed as it is."""
    jsonl, packed = made
    copy = tmp_path / "data.jsonl"
    shutil.copy(jsonl, copy)
    assert make_data.main(["--target", str(TINY), "--prompts", str(jsonl.parent / "prompts.jsonl"),
                           "--out", str(copy), "--max-new-tokens", "16", "--device", "cpu",
                           "--pack", str(tmp_path / "again")]) == 0
    assert data.load_sequences(tmp_path / "again", 100, 512).sha256 == \
        data.load_sequences(packed, 100, 512).sha256
