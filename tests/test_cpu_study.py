"""benchmarks/cpu_study.py: the acceptance model, the forced drafts, and one short run on the tiny
shape (its rows' keys and sanity; no timing is asserted)."""

import itertools
import json

import pytest
import torch

import cpu_study

torch.set_num_threads(1)


@pytest.mark.parametrize("tau, block", [(6.55, 16), (1.0, 16), (16.0, 16), (2.5, 4)])
def test_acceptance_for_gives_the_mean_asked(tau, block):
    p = cpu_study.acceptance_for(tau, block)
    assert 0.0 <= p <= 1.0
    assert cpu_study.expected_tau(cpu_study.geometric(p, block), block) == pytest.approx(
        tau, abs=1e-9)


def test_planned_acceptance_follows_the_law():
    """The drafts kept per step: within the block, their mean near the law's after a few steps."""
    block, tau = 16, 6.55
    p = cpu_study.acceptance_for(tau, block)
    steps = list(itertools.islice(cpu_study.planned_acceptance(p, block), 200))
    assert all(0 <= kept <= block - 1 for kept in steps)
    assert 1 + sum(steps) / len(steps) == pytest.approx(tau, rel=0.03)
    assert 1 + sum(steps[:10]) / 10 == pytest.approx(tau, rel=0.25)  # a short run is already close
    assert set(itertools.islice(cpu_study.planned_acceptance(0.0, block), 5)) == {0}
    assert set(itertools.islice(cpu_study.planned_acceptance(1.0, block), 5)) == {block - 1}


def test_random_pair_is_built_in_its_dtype():
    target, drafter = cpu_study.random_pair(cpu_study.SHAPES["tiny"], torch.bfloat16, 16)
    assert {p.dtype for p in [*target.parameters(), *drafter.parameters()]} == {torch.bfloat16}
    assert target.rotary.inv_freq.dtype == torch.float32
    assert drafter.config.block_size == 16 and len(drafter.layers) == cpu_study.DRAFTER_LAYERS


def test_the_study_on_the_tiny_shape(tmp_path, capsys):
    out = tmp_path / "study.json"
    argv = ["--shapes", "tiny", "--dtype", "float32", "--threads", "1", "--tokens", "2,8,16",
            "--context", "16", "--new-tokens", "40", "--rounds", "1", "--pass-rounds", "1",
            "--pass-repeats", "1", "--measure-blocks", "8", "--foresee", "--json", str(out)]
    assert cpu_study.main(argv) == 0
    report = json.loads(out.read_text())
    assert "| tiny | float32 | 1 (cpu) |" in capsys.readouterr().out  # the Markdown table
    assert report["conditions"]["cpu"]["logical_cpus"] >= 1 and report["skipped"] == []
    (row,) = report["rows"]
    for key in ("shape", "dtype", "threads", "decode_ms", "verify_ms", "draft_ms", "tau",
                "weight_bytes", "read_gb_per_s", "floor_ms", "decode_of_floor",
                "predicted_speedup", "measured_speedup", "verify_fit_ms", "block_sweep",
                "best_block", "plain_tokens_per_s", "dflash_tokens_per_s", "load_average_before",
                "load_average_after"):
        assert key in row, key
    assert (row["shape"], row["dtype"], row["threads"]) == ("tiny", "float32", 1)
    blocks = {"2", "8", "16"}  # JSON keys
    assert set(row["verify_ms"]) == set(row["draft_ms"]) == set(row["block_sweep"]) == blocks
    assert set(row["block_sweep_fitted"]) == {str(n) for n in range(2, 17)}
    assert row["best_block"] in (2, 8, 16)  # of those timed
    assert 2 <= row["best_block_fitted"] <= 16  # of every block the fitted lines predict
    assert row["clock"] == "cpu"  # one thread: the process's CPU time
    # The floor: the target's weights (tied: the head is the embedding) read at the probes' speed
    target, _ = cpu_study.random_pair(cpu_study.SHAPES["tiny"], torch.float32, 16)
    assert row["weight_bytes"] == 4 * sum(p.numel() for p in target.parameters())
    probes = row["bandwidth_probes"]
    assert row["read_gb_per_s"] == max(probes["sum_gb_per_s"], probes["gemv_gb_per_s"]) > 0
    assert row["floor_ms"] == pytest.approx(row["weight_bytes"] / row["read_gb_per_s"] / 1e6)
    assert row["decode_of_floor"] == pytest.approx(row["floor_ms"] / row["decode_ms"])
    assert row["compiled"] is False and report["conditions"]["backend"] == "eager"
    costs = [row["decode_ms"], *row["verify_ms"].values(), *row["draft_ms"].values()]
    assert min(costs) > 0
    # The forcing worked: in float32 the loop kept exactly the drafts the plan said.
    assert row["truth_settled"] and row["acceptance_as_planned"]
    assert row["tau"] == sum(row["acceptance_lengths"]) / row["steps"]
    assert row["tau"] == pytest.approx(row["tau_model"], rel=0.3)
    assert sum(row["acceptance_lengths"]) >= 40 - 1  # every token after the first: from a step
    assert row["predicted_speedup"] > 0 and row["measured_speedup"] > 0
    # --measure-blocks 8: the loop at block 8 too, its acceptance as the same p plans it
    assert set(row["measured_blocks"]) == {"8", "16"}
    at_8 = row["measured_blocks"]["8"]
    assert at_8["acceptance_as_planned"] and max(at_8["acceptance_lengths"]) <= 8
    assert at_8["tau"] < row["tau"] and at_8["predicted_speedup"] > 0
    # --foresee: block 16 offering only the drafts kept gives the same output
    assert row["foreseeing"]["block"] == 16 and row["foreseeing"]["same_output"]


def test_forced_drafts_steer_a_wrapped_runner_and_leave_it_as_it_was():
    target, drafter = cpu_study.random_pair(cpu_study.SHAPES["tiny"], torch.float32, 4)
    runner = cpu_study.generate.ModelRunner(target, drafter, max_length=64, block_size=4)
    truth = list(range(10, 40))
    runner.prefill(truth[:4], 0.0, None)  # the block opens at position 4, after the prompt
    forced = cpu_study.forced_drafts(runner, truth, iter([1]))
    guesses = forced.draft(torch.zeros(1, 4, runner.features.shape[-1]), 14).argmax(dim=-1)
    assert guesses[0] == truth[5] and guesses[2] == truth[7]
    assert guesses[1] != truth[6]  # the plan's one miss, after one right guess
    assert "draft" not in vars(runner)  # the runner's own draft is untouched


@pytest.mark.parametrize("argv", [["--shapes", "Qwen3-3B"], ["--dtype", "float16"],
                                  ["--threads", "0"], ["--threads", "1,x"], ["--tokens", "1,16"],
                                  ["--block-size", "8", "--tokens", "2,16"], ["--tau", "17"],
                                  ["--measure-blocks", "8", "--tokens", "2,16"],
                                  ["--tau", "0.5"]])
def test_bad_values_are_one_error_line(argv, capsys):
    assert cpu_study.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_least_time_reads_the_clock_it_is_given():
    """The study's one-thread rows time with the process's CPU time, through least_time's clock."""
    ticks = itertools.count()
    seconds = cpu_study.least_time({"loop": {"job": lambda: None}}, rounds=2, calls=3,
                                   clock=lambda: next(ticks))
    assert seconds == {"job": 1.0}  # every call: one tick between its two readings
    assert [cpu_study.clock_for("auto", n) for n in (1, 2)] == ["cpu", "wall"]
    assert cpu_study.clock_for("wall", 1) == "wall"
