"""benchmarks/drafter_check.py --engine-acceptance: a serving engine's per-position acceptance, in
each shape vLLM and SGLang report it, set beside a training log; where they part is named."""

import json
from pathlib import Path

import pytest

import drafter_check
from drafter_check import (EngineAcceptance, compare_with_engine, once_reached, read_engine_acceptance,
                           running_product)
from tests.test_train import one_error_line

ROOT = Path(__file__).resolve().parents[1]

# The shipped drafter's last logged slot accuracy (weights/tiny-qwen3-dflash/train_log.jsonl).
LOG = [0.9459, 0.9498, 0.9389, 0.929, 0.9143, 0.893, 0.85, 0.8142, 0.7881, 0.7667, 0.7471, 0.7187,
       0.6953, 0.6737, 0.6377]
HERE_WELL = [0.96, 0.95, 0.95, 0.94, 0.93, 0.9, 0.88, 0.85, 0.8, 0.8, 0.78, 0.75, 0.7, 0.7, 0.66]


def written(tmp_path: Path, data, name: str = "engine.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def collapsed_at(position: int, rates: list[float], to: float = 0.2) -> list[float]:
    """`rates` (acceptance once reached) with the one at `position` (1-based) dropped to `to`."""
    return [to if k == position else rate for k, rate in enumerate(rates, start=1)]


@pytest.mark.parametrize("data, shape", [
    ([0.9, 0.72, 0.36], "per-position rates"),  # vLLM's "Per-position acceptance rate" line
    ({"num_drafts": 100, "num_accepted_tokens_per_pos": [90, 72, 36]}, "vLLM counts"),
    ({"spec_accept_histogram": [10, 18, 36, 36]}, "SGLang histogram"),  # steps keeping 0..3
    ({"text": "...", "meta_info": {"spec_accept_histogram": [10, 18, 36, 36]}}, "SGLang"),
])
def test_every_engine_shape_reads_as_the_same_cumulative_series(tmp_path, data, shape):
    engine = read_engine_acceptance(written(tmp_path, data))
    assert engine.cumulative == pytest.approx([0.9, 0.72, 0.36]) and engine.shape.startswith(shape)
    assert engine.drafts == (None if isinstance(data, list) else 100)
    assert once_reached(engine.cumulative) == pytest.approx([0.9, 0.8, 0.5])


def test_once_reached_and_running_product_undo_each_other():
    assert once_reached(running_product(LOG)) == pytest.approx(LOG)
    assert running_product([0.5, None, 0.9]) == [0.5, 0.0, 0.0]  # a position never reached
    assert once_reached([0.5, 0.0, 0.0]) == [0.5, 0.0, None]


def test_matching_numbers_give_no_gap():
    engine = EngineAcceptance(running_product(LOG), None, "per-position rates")
    comparison = compare_with_engine(engine, {"slot_accuracy": LOG}, HERE_WELL)
    assert comparison.parts_at is None and comparison.verdict.startswith("no gap"), comparison
    assert comparison.reference == "the training log's slot_accuracy"
    assert comparison.log_cumulative == pytest.approx(engine.cumulative)


@pytest.mark.parametrize("position", [1, 3, 9])
def test_an_engine_that_collapses_at_a_position_is_named_there(position):
    engine = EngineAcceptance(running_product(collapsed_at(position, LOG)), None, "rates")
    comparison = compare_with_engine(engine, {"slot_accuracy": LOG}, HERE_WELL)
    assert comparison.parts_at == position, comparison
    assert f"at position {position} (vLLM's index {position - 1})" in comparison.verdict
    assert "so the engine serves it otherwise than it was trained" in comparison.verdict


def test_the_served_figure_in_the_log_is_preferred_and_a_drafter_low_here_is_blamed():
    served = [0.97] * 15
    engine = EngineAcceptance(running_product(collapsed_at(3, served)), None, "rates")
    claimed = {"slot_accuracy": LOG, "eval_slot_acceptance": served}
    comparison = compare_with_engine(engine, claimed, collapsed_at(3, HERE_WELL, to=0.25))
    assert comparison.reference == "the training log's eval_slot_acceptance"
    assert comparison.parts_at == 3 and "the drafter, not the engine" in comparison.verdict


def test_without_a_log_the_engine_is_set_beside_what_is_served_here():
    engine = EngineAcceptance(running_product(collapsed_at(2, HERE_WELL)), None, "rates")
    comparison = compare_with_engine(engine, None, HERE_WELL)
    assert comparison.reference == "the drafter served here" and comparison.parts_at == 2


def test_a_gap_where_too_few_drafts_reached_is_not_named(tmp_path):
    # position 3 was reached by 20 drafts of 100: its 1 of 20 could be chance
    engine = read_engine_acceptance(written(tmp_path, {"num_drafts": 100,
                                                       "num_accepted_tokens_per_pos": [95, 20, 1]}))
    assert compare_with_engine(engine, {"slot_accuracy": [0.95, 0.2, 0.9]}, []).parts_at is None
    engine.drafts = 1000  # the same shares over ten times the drafts: now it is clear
    assert compare_with_engine(engine, {"slot_accuracy": [0.95, 0.2, 0.9]}, []).parts_at == 3


def argv(engine_file: Path) -> list[str]:
    return ["--model", str(ROOT / "weights" / "tiny-qwen3"), "--draft",
            str(ROOT / "weights" / "tiny-qwen3-dflash"), "--prompts",
            str(ROOT / "weights" / "heldout_problems.jsonl"), "--device", "cpu",
            "--engine-acceptance", str(engine_file)]


@pytest.mark.parametrize("text, message", [
    ("[0.9, 0.8,", "not valid JSON"),
    ('{"acceptance": [0.9]}', "expected a list of per-position acceptance rates"),
    ("[]", "expected a non-empty list of numbers"),
    ('[0.9, "0.8"]', "expected a non-empty list of numbers"),
    ("[1.2, 0.5]", "position 1's rate 1.2 is outside 0..1"),
    ("[0.5, 0.7]", "the rate rises at position 2"),
    ('{"num_drafts": 0, "num_accepted_tokens_per_pos": [0]}', "num_drafts must be a positive"),
    ('{"num_drafts": 10, "num_accepted_tokens_per_pos": [11]}', "outside 0..1"),
    ('{"num_drafts": 10, "num_accepted_tokens_per_pos": [true]}', "must be a list of counts"),
    ('{"spec_accept_histogram": [0, 0]}', "spec_accept_histogram must be a list of at least two"),
])
def test_bad_engine_json_is_one_error_line(tmp_path, capsys, text, message):
    error = one_error_line(capsys, argv(written(tmp_path, text)), drafter_check.main)
    assert "--engine-acceptance" in error and message in error, error


def test_more_positions_than_the_drafter_drafts_is_one_error_line(tmp_path, capsys):
    error = one_error_line(capsys, argv(written(tmp_path, [0.9] * 16)), drafter_check.main)
    assert "16 positions, but this drafter drafts 15 tokens a step" in error
