"""dflash/block_choice.py and `--block-size auto`: the step model by hand, the choice on costs made
up to favour a large or a small block, the acceptance read from a log or measured, the calibration
kept per machine and model, and generate.py choosing a block and staying lossless. No timing is
asserted: the calibration's figures are checked for their shape, not their values."""

import json
import sys

import pytest
import torch

import generate
from dflash import block_choice
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from test_cli import DRAFTER, EXPECTED, PAIR, PROMPT_IDS, TARGET

torch.set_num_threads(1)
DEMO_DRAFTER = generate.WEIGHTS / "tiny-qwen3-dflash"


def costs(draft: tuple[float, float], verify: tuple[float, float]) -> dict:
    """Fitted pass costs: (overhead, per token) for the draft and the verify."""
    line = lambda pair: {"overhead": pair[0], "per_token": pair[1]}  # noqa: E731
    return {"draft_fit_ms": line(draft), "verify_fit_ms": line(verify)}


def test_expected_tau_by_hand():
    # slot 1 kept half the time; slot 2 half the time once slot 1 was; slot 3 always once reached
    assert block_choice.expected_tau([0.5, 0.5, 1.0], 4) == 1 + 0.5 + 0.25 + 0.25
    assert block_choice.expected_tau([0.5, 0.5, 1.0], 2) == 1.5
    assert block_choice.expected_tau([0.0] * 15, 16) == 1.0


@pytest.mark.parametrize("tau, block", [(6.55, 16), (1.0, 16), (16.0, 16), (2.5, 4)])
def test_acceptance_for_gives_the_mean_asked(tau, block):
    p = block_choice.acceptance_for(tau, block)
    assert block_choice.expected_tau(block_choice.geometric(p, block), block) == \
        pytest.approx(tau, abs=1e-9)


def test_flat_costs_pick_the_largest_block_and_steep_costs_a_small_one():
    good = [0.9] * 15
    block, speeds = block_choice.best_block(costs((1.0, 0.0), (5.0, 0.0)), good, range(2, 17))
    assert block == 16 and sorted(speeds) == list(range(2, 17))
    # Each verified token costs as much as the overhead: block n costs 2 + n ms
    # (draft 1 ms flat); tokens per step (1 - 0.9^n) / 0.1. By hand: n = 6 (5 is 0.1 % slower).
    block, speeds = block_choice.best_block(costs((1.0, 0.0), (1.0, 1.0)), good, range(2, 17))
    by_hand = {n: (1 - 0.9 ** n) / 0.1 / (2 + n) for n in range(2, 17)}
    assert block == max(by_hand, key=by_hand.get) == 6
    assert speeds[block] == pytest.approx(by_hand[block])
    # Offered only the blocks timed, 4 and 8 (say), it takes the better: 4 (0.573 against 0.570)
    assert block_choice.best_block(costs((1.0, 0.0), (1.0, 1.0)), good, [4, 8])[0] == 4


def test_a_drafter_that_misses_its_late_slots_gets_a_smaller_block():
    """The same flat costs; acceptance falling to 0 after slot 3: slots past 4 buy nothing, and a
    block that costs a little more per token stops at 4."""
    early_only = [0.95, 0.9, 0.9] + [0.0] * 12
    block, _ = block_choice.best_block(costs((1.0, 0.05), (5.0, 0.2)), early_only, range(2, 17))
    assert block == 4


def test_the_log_gives_the_last_per_slot_figures(tmp_path):
    last = [json.loads(line) for line in (DEMO_DRAFTER / "train_log.jsonl").read_text().splitlines()
            if "slot_accuracy" in line][-1]
    assert block_choice.logged_acceptance(DEMO_DRAFTER) == last["slot_accuracy"]
    lines = [{"step": 1, "slot_accuracy": [0.9, 0.8]},
             {"step": 2, "slot_accuracy": [0.7, 0.6], "heldout_slot_accuracy": [0.5, 0.4]},
             {"step": 3, "loss": 1.0}]  # no per-slot figures: the line before stands
    (tmp_path / "train_log.jsonl").write_text(
        "\n".join(map(json.dumps, lines)) + '\n{"step": 4, "slot_acc')  # cut by a crash
    assert block_choice.logged_acceptance(tmp_path) == [0.5, 0.4]  # held-out before training
    assert block_choice.logged_acceptance(tmp_path / "nowhere") is None


def test_steps_without_a_log_give_one_rate_with_their_mean():
    lengths = [5, 16, 1, 7, 3]
    acceptance = block_choice.measured_acceptance(lengths, 16)
    assert len(acceptance) == 15 and len(set(acceptance)) == 1
    assert block_choice.expected_tau(acceptance, 16) == pytest.approx(sum(lengths) / 5)


def kept_costs(value: float, blocks=(2, 4)) -> dict:
    """Pass costs as `calibrate` gives them, every figure `value` ms."""
    line = {"overhead": value, "per_token": 0.0}
    return {"blocks": list(blocks), "draft_ms": dict.fromkeys(blocks, value),
            "verify_ms": dict.fromkeys(blocks, value), "draft_fit_ms": line, "verify_fit_ms": line}


def as_kept(costs: dict) -> dict:
    return json.loads(json.dumps(costs))  # block keys as text, as the cache file keeps them


def test_a_calibration_is_measured_once_per_key_and_a_broken_cache_is_measured_over(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    measured = []

    def measure(value):
        return lambda: measured.append(value) or kept_costs(value)

    cached = lambda key, value: block_choice.cached_calibration(key, measure(value), [2, 4])  # noqa
    assert cached("a", 1) == (kept_costs(1), True)
    assert cached("a", 2) == (as_kept(kept_costs(1)), False)
    assert cached("b", 3) == (kept_costs(3), True)
    assert measured == [1, 3]
    assert "note:" not in capsys.readouterr().err
    block_choice.cache_file().write_text("{not json")
    assert cached("a", 4) == (kept_costs(4), True)
    assert capsys.readouterr().err.count("note:") == 1


@torch.no_grad()
def test_calibration_times_each_block_and_leaves_the_caches_as_found():
    target = Qwen3.from_pretrained(TARGET, dtype=torch.float32)
    drafter = Drafter.from_pretrained(DRAFTER, target=target, dtype=torch.float32)
    runner = block_choice.steady_runner(generate.ModelRunner, target, drafter, 8, 40, False)
    lengths = lambda: (runner.target_cache.length, runner.drafter_cache.length)  # noqa: E731
    passes = block_choice.step_passes(runner, 8)
    before = lengths()
    assert before == (40, 40 - 8 // 2)  # mid-reply: the drafter has yet to see the kept half
    for job in passes.values():
        job()
        assert lengths() == before
    blocks = block_choice.calibration_blocks(drafter.config.block_size)  # eager: every even one
    assert blocks == [2, 4, 6, 8] and block_choice.calibration_blocks(16, compile=True) == [
        2, 4, 8, 12, 16]
    found = block_choice.calibrate(generate.ModelRunner, target, drafter, blocks, seconds=0)
    assert sorted(found["verify_ms"]) == blocks and sorted(found["draft_ms"]) == blocks
    assert all(ms > 0 for ms in [*found["verify_ms"].values(), *found["draft_ms"].values()])
    key = block_choice.calibration_key(target, drafter, compile=False)
    assert "eager" in key and "float32" in key and f"{torch.get_num_threads()} threads" in key


def test_generate_block_size_auto_picks_a_block_and_stays_lossless(tmp_path, monkeypatch, capsys):
    """The fixture drafter has no log: its acceptance comes from first steps; the output is still
    the target's own greedy output."""
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    argv = ["--prompt-ids", PROMPT_IDS, *PAIR, "--max-new-tokens", "40", "--json",
            "--block-size", "auto", "--threads", "1"]
    assert generate.main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["output_ids"] == EXPECTED
    assert "[block size auto: " in err and "first steps" in err and "calibrated now" in err
    assert generate.main(argv) == 0
    assert "calibrated before" in capsys.readouterr().err
    assert json.loads((tmp_path / "block_costs.json").read_text())  # kept, one key


@pytest.mark.parametrize("extra, message", [
    (["--block-size", "auto", "--tree", "4"], "--block-size auto is chosen for greedy chains"),
    (["--block-size", "auto", "--draft-policy", "sampled"], "greedy chains"),
    (["--block-size", "big"], "--block-size"),
    (["--block-size", "1"], "at least 2 or auto")])
def test_auto_is_refused_where_it_has_no_meaning(extra, message, capsys):
    argv = ["--prompt-ids", "1,2,3", *PAIR, *extra]
    if "sampled" in extra:
        argv += ["--temperature", "0.7"]
    assert generate.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
