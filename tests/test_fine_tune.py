"""`train.py --init-from`: fine-tuning a trained drafter, here the shipped demo drafter on the demo target's answers."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import make_data
import train
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from tests.test_train import one_error_line, write_data

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "weights" / "tiny-qwen3", ROOT / "weights" / "tiny-qwen3-dflash"
QUESTIONS = [  # everyday words, as the fine-tuning recipe's data (none of them in weights/)
    "Uncle Dev packs 4 bags with 6 pears in each one. How many pears did he pack?",
    "Keisha had 52 buttons. She lost 17 of them on the way home. How many buttons does she still have?",
    "A swim pass costs 7 euros. Our team buys 6 of them. How much do they pay in all?",
    "Mateo owns 81 shells and Bea owns 35. How many more shells does Mateo own than Bea?",
    "The trip lasts 3 days. How many hours is that?",
    "Fatima shares 36 carrots equally among 4 friends. How many carrots does each friend get?",
]


def copy_of_drafter(folder: Path, **dflash_changes) -> Path:
    """The shipped drafter, saved again with `dflash_config` fields changed (a drafter that fits less well)."""
    shutil.copytree(DRAFTER, folder)
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"].update(dflash_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> Path:
    """The target's own answers to the questions: make_data.py's output, as the recipe makes it."""
    folder = tmp_path_factory.mktemp("data")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    assert make_data.main(["--target", str(TARGET), "--prompts", str(prompts), "--out", str(folder / "data.jsonl"),
                           "--max-new-tokens", "48", "--batch-size", "6", "--device", "cpu"]) == 0
    return folder / "data.jsonl"


def fine_tune_argv(data: Path, out: Path, *extra: str, steps: int = 6) -> list[str]:
    return ["--target", str(TARGET), "--data", str(data), "--out", str(out), "--init-from", str(DRAFTER),
            "--num-anchors", "8", "--batch-size", "3", "--steps", str(steps), "--lr", "1e-3", "--warmup", "0",
            "--log-every", "1", "--device", "cpu", *extra]


def logged_losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_init_from_fine_tunes_the_shipped_drafter(tmp_path, answers):
    """It starts where the drafter is (a low loss, not a new drafter's ln(1024) = 6.9), the loss falls, the weights
    move, and the saved drafter keeps the shape it came with."""
    assert train.main(fine_tune_argv(answers, tmp_path / "tuned", steps=12)) == 0
    losses = logged_losses(tmp_path / "tuned")
    assert losses[0] < 3.0, losses
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    before, after = load_file(DRAFTER / "model.safetensors"), load_file(tmp_path / "tuned" / "model.safetensors")
    assert before.keys() == after.keys()
    assert not all(torch.equal(before[name], after[name]) for name in before)
    tuned = Drafter.from_pretrained(tmp_path / "tuned", target=Qwen3.from_pretrained(TARGET))
    assert tuned.config.to_dict() == Drafter.from_pretrained(DRAFTER).config.to_dict()


def test_a_new_drafter_starts_far_higher(tmp_path, answers):
    """The test above can fail: the same run without --init-from starts at a new drafter's loss."""
    argv = fine_tune_argv(answers, tmp_path / "new", "--drafter-layers", "2", steps=1)
    del argv[argv.index("--init-from"):argv.index("--init-from") + 2]
    assert train.main(argv) == 0
    assert logged_losses(tmp_path / "new")[0] > 5.0


def test_a_fine_tuning_run_resumes_exactly(tmp_path, answers):
    assert train.main(fine_tune_argv(answers, tmp_path / "straight")) == 0
    assert train.main(fine_tune_argv(answers, tmp_path / "split", "--stop-at", "3")) == 0
    assert train.main(fine_tune_argv(answers, tmp_path / "split", "--resume")) == 0
    straight, split = load_file(tmp_path / "straight" / "model.safetensors"), load_file(
        tmp_path / "split" / "model.safetensors")
    assert all(torch.equal(straight[name], split[name]) for name in straight)
    assert [json.loads(line)["step"] for line in (tmp_path / "split" / "train_log.jsonl").read_text().splitlines()] \
        == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("changes, named", [
    ({"target_layer_ids": [1, 8]}, "target_layer_ids entry 8 is outside the target's 8 layers"),
    ({"mask_token_id": 1024}, "mask_token_id=1024 is outside the target's vocab_size=1024"),
])
def test_a_drafter_that_does_not_fit_the_target_is_refused_by_name(tmp_path, capsys, answers, changes, named):
    argv = fine_tune_argv(answers, tmp_path / "out")
    argv[argv.index(str(DRAFTER))] = str(copy_of_drafter(tmp_path / "drafter", **changes))
    assert named in one_error_line(capsys, argv)


def test_a_drafter_for_another_target_is_refused_by_name(tmp_path, capsys, answers):
    argv = fine_tune_argv(answers, tmp_path / "out")
    argv[argv.index(str(DRAFTER))] = str(ROOT / "tests" / "fixtures" / "dflash-tiny")  # made for qwen3-tiny
    assert "drafter hidden_size=96 does not fit the target's hidden_size=128" in one_error_line(capsys, argv)


@pytest.mark.parametrize("option, value, named", [
    ("--block-size", "8", "--block-size 8 does not fit the --init-from drafter's block_size 16"),
    ("--drafter-layers", "3", "--drafter-layers 3 does not fit the --init-from drafter's drafter_layers 2"),
    ("--target-layer-ids", "1,4", "--target-layer-ids [1, 4] does not fit the --init-from drafter's target_layer_ids"),
    ("--mask-token-id", "1021", "--mask-token-id 1021 does not fit the --init-from drafter's mask_token_id 1020"),
])
def test_an_option_that_would_reshape_the_drafter_is_refused(tmp_path, capsys, answers, option, value, named):
    assert named in one_error_line(capsys, fine_tune_argv(answers, tmp_path / "out", option, value))
    assert train.main(fine_tune_argv(answers, tmp_path / "same", "--block-size", "16", steps=1)) == 0  # its own: fine


def test_a_drafter_in_the_authors_layout_fine_tunes(tmp_path):
    """The fixture drafter was written in the authors' released layout (bfloat16); it trains in float32."""
    data = tmp_path / "data.jsonl"
    write_data(data)
    fixtures = ROOT / "tests" / "fixtures"
    argv = ["--target", str(fixtures / "qwen3-tiny-sharded"), "--init-from", str(fixtures / "dflash-tiny"),
            "--data", str(data), "--out", str(tmp_path / "out"), "--num-anchors", "4", "--batch-size", "3",
            "--steps", "2", "--device", "cpu", "--dtype", "float32"]  # the config says bf16
    assert train.main(argv) == 0
    before, after = load_file(fixtures / "dflash-tiny" / "model.safetensors"), load_file(tmp_path / "out" /
                                                                                         "model.safetensors")
    assert all(after[name].dtype == torch.float32 for name in after)
    assert not all(torch.equal(before[name].float(), after[name]) for name in before)
