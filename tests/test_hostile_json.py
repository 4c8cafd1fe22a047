"""JSON as a hostile user writes it, through the programs that read it (issue 50): nesting deep
enough to overflow Python's parser and a key given twice, in a checkpoint's config, a data line and
a prompt line. Each is one `error:` line naming the file (and the line), exit 2, nothing touched."""

import json
import shutil
from pathlib import Path

import pytest

import generate
import make_data
import train
from tests.snapshots import assert_untouched, tree_bytes
from tests.test_hostile_inference import linked, refused
from tests.test_hostile_training import TRAIN, one_error_line, records

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DEEP = "[" * 100_000 + "]" * 100_000
IDS = ["--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--device", "cpu"]


@pytest.mark.parametrize("json_text, fragment", [
    ('{"hidden_size": ' + DEEP + "}", "nested too deeply"),
    ('{"hidden_size": 64, "hidden_size": 96}', '"hidden_size" comes twice')])
def test_a_target_config_too_deep_or_with_a_key_twice_is_one_line(tmp_path, capsys, json_text,
                                                                    fragment):
    target = linked(FIXTURES / "qwen3-tiny-sharded", tmp_path / "target", "config.json")
    (target / "config.json").write_text(json_text)
    before = tree_bytes(target)
    refused(["--model", target, "--draft", FIXTURES / "dflash-tiny", *IDS], capsys,
            "config.json", fragment)
    assert_untouched(before, target)


@pytest.mark.parametrize("line, fragment", [
    ('{"input_ids": ' + DEEP + "}", "nested too deeply"),
    ('{"input_ids": [1, 2], "loss_mask": [0, 1], "input_ids": [3, 4]}', '"input_ids" comes twice')])
def test_a_data_line_too_deep_or_with_a_key_twice_names_its_line(tmp_path, capsys, line,
                                                                  fragment):
    data = tmp_path / "d.jsonl"
    data.write_text(records(3) + line + "\n")
    before = tree_bytes(data)
    error = one_error_line(capsys, train.main, ["--target", str(FIXTURES / "qwen3-tiny"),
                                                "--data", str(data), "--out",
                                                str(tmp_path / "run"), *TRAIN])
    assert f"{data}:4" in error and fragment in error, error
    assert_untouched(before, data)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("line, fragment", [
    ('{"prompt": ' + DEEP + "}", "nested too deeply"),
    ('{"prompt": "a", "prompt": "b"}', '"prompt" comes twice')])
def test_a_prompt_line_too_deep_or_with_a_key_twice_names_its_line(tmp_path, capsys, line,
                                                                    fragment):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    target = tmp_path / "target"
    shutil.copytree(ROOT / "weights" / "tiny-qwen3", target)
    before = tree_bytes(prompts, target)
    error = one_error_line(capsys, make_data.main, ["--target", str(target), "--prompts",
                                                    str(prompts), "--out",
                                                    str(tmp_path / "out.jsonl"), "--device",
                                                    "cpu"])
    assert f"{prompts}:2" in error and fragment in error, error
    assert_untouched(before, prompts, target)
    assert not (tmp_path / "out.jsonl").exists()
