"""benchmarks/drafter_check.py names the convention error of drafters made wrong on purpose, none for the shipped one.

Each broken drafter is the shipped demo drafter, broken the way the bug reports describe: its config saved with the
target layer ids one off, or with the pad token <|endoftext|> as its mask token (the weights untouched: served, it
drafts from the wrong features or with the wrong filler); and, for labels shifted by one slot, the drafter
fine-tuned for a few steps with train.py's labels moved one position right (slot k learns x_(a+k+1), the causal-LM
shift applied to a block), which turns it into a drafter that really was trained that way.
"""

import json
from pathlib import Path

import pytest
import torch

import drafter_check
import train
from dflash.drafter import Drafter
from dflash.prompts import encode_for_generation, read_prompts
from dflash.qwen3 import Qwen3
from dflash.tokenizer import find_tokenizer, stop_token_ids
from tests.test_fine_tune import DRAFTER, TARGET, answers, copy_of_drafter, fine_tune_argv  # noqa: F401 (a fixture)
from tests.test_train import one_error_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served():
    """The demo target and four held-out prompts (short answers keep the check fast)."""
    target, tokenizer = Qwen3.from_pretrained(TARGET), find_tokenizer(TARGET)
    prompts = [encode_for_generation(prompt, tokenizer) for prompt in read_prompts(ROOT / "weights" /
                                                                                    "heldout_problems.jsonl")[:4]]
    return target, tokenizer, prompts


def check(served, folder: Path) -> drafter_check.Report:
    target, tokenizer, prompts = served
    drafter = Drafter.from_pretrained(folder, target)
    return drafter_check.check_drafter(target, drafter, prompts, 32, stop_token_ids(TARGET, tokenizer),
                                       drafter_check.candidate_mask_tokens(target, tokenizer),
                                       drafter_check.training_log_claim(folder))


def test_the_shipped_drafter_fits_its_config(served):
    report = check(served, DRAFTER)
    assert report.fits == "as configured" and report.verdict.startswith("no convention error")
    assert report.served_tau > 4.0  # it drafts well here: the figures below are measured, not defaults
    assert report.claimed["step"] == 1250 and len(report.claimed["slot_accuracy"]) == 15
    assert report.scores["as configured"].tau > report.scores["labels +1 slot"].tau


def test_prompts_unlike_the_training_data_are_told_apart_from_a_convention_error(served):
    target, tokenizer, _ = served
    hand_written = [encode_for_generation(prompt, tokenizer) for prompt in read_prompts(ROOT / "weights" /
                                                                                          "handwritten_problems.jsonl")]
    report = check((target, tokenizer, hand_written[:6]), DRAFTER)
    assert report.fits == "as configured" and "unlike its training data" in report.verdict, report


@pytest.mark.parametrize("layer_ids, fits, named", [
    ([2, 6], "target layer ids -1", "[1, 5]"),
    ([0, 4], "target layer ids +1", "[1, 5]"),
])
def test_target_layer_ids_off_by_one_are_named(served, tmp_path, layer_ids, fits, named):
    report = check(served, copy_of_drafter(tmp_path / "drafter", target_layer_ids=layer_ids))
    assert report.fits == fits, report.scores
    assert "target layer ids off by one" in report.verdict and named in report.verdict


def test_the_pad_token_as_mask_token_is_named(served, tmp_path):
    report = check(served, copy_of_drafter(tmp_path / "drafter", mask_token_id=0))  # <|endoftext|>
    assert report.fits == "mask token 1020", report.scores
    assert "another mask token" in report.verdict and "1020" in report.verdict


def labels_shifted_right(input_ids, loss_mask, anchors, real, block_size):
    """train.py's labels, each taken one position later: slot k is labelled x_(a+k+1)."""
    later_ids = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)  # (batch, S)
    later_mask = torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1)  # the last has no label
    return ORIGINAL_LABELS(later_ids, later_mask, anchors, real, block_size)


ORIGINAL_LABELS = train.block_labels


def test_labels_shifted_by_one_slot_are_named(served, tmp_path, monkeypatch, answers):  # noqa: F811
    monkeypatch.setattr(train, "block_labels", labels_shifted_right)
    assert train.main(fine_tune_argv(answers, tmp_path / "shifted", "--lr", "3e-3", steps=20)) == 0
    report = check(served, tmp_path / "shifted")
    assert report.fits == "labels +1 slot", report.scores
    assert "labels shifted by +1 slot" in report.verdict


def test_the_command_line(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text((ROOT / "weights" / "heldout_problems.jsonl").read_text().splitlines()[0] + "\n")
    # an engine that served the drafter as its log predicts (vLLM's per-position rates)
    claimed = drafter_check.training_log_claim(DRAFTER)
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps(drafter_check.running_product(claimed["slot_accuracy"])))
    argv = ["--model", str(TARGET), "--draft", str(DRAFTER), "--prompts", str(prompts), "--max-new-tokens", "16",
            "--device", "cpu", "--json", str(tmp_path / "report.json"),
            "--engine-acceptance", str(engine)]
    assert drafter_check.main(argv) == 0
    out = capsys.readouterr().out
    assert "training log, step 1250" in out and "verdict: no convention error" in out
    assert "serving config (benchmarks/engine_fields.py): every field vLLM and SGLang read" in out
    assert "verdict (engine): no gap" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["engine_fields"] == [] and report["engine"]["parts_at"] is None
    argv.remove("--engine-acceptance")
    argv.remove(str(engine))
    argv[argv.index(str(DRAFTER))] = str(ROOT / "tests" / "fixtures" / "dflash-tiny")  # made for another target
    assert "does not fit the target's hidden_size=128" in one_error_line(capsys, argv, drafter_check.main)
