"""The benchmarks: the measuring arithmetic (dflash/measure.py) on step records made up by hand, short runs of
benchmarks/bench.py on the fixture pair, and the helpers every benchmark shares (benchmarks/bench_common.py)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import bench
import bench_common
import generate
from dflash import measure
from dflash.results import Generation, acceptance_histogram, per_position_acceptance
from dflash.measure import (BenchPrompt, Loops, Run, distinct_ngram_ratio, efficiency, ideal_speedup,
                            is_degenerate, loop_figures, summarize_row)
from dflash.errors import UsageError
from dflash.sampling import Sampling
from dflash.drafter import Drafter
from dflash.qwen3 import Qwen3
from dflash.training import init_weights
from generate import ModelRunner

FIXTURES = Path(__file__).parent / "fixtures"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny"  # the drafter's block: 8
PAIR = ["--model", str(TARGET), "--draft", str(DRAFTER)]
PROMPTS = [[5, 17, 42, 99, 3, 250], [11, 12, 13, 14, 15, 16, 17, 18, 19], [400, 7, 300]]
NEW_TOKENS = 1 + 3 * 8  # the prefill's token, then three whole blocks of 8: no step is cut short
torch.set_num_threads(1)


# ------------------------------------------------------------------ the arithmetic


def test_distinct_ngram_ratio():
    assert distinct_ngram_ratio([1, 2, 3, 4, 5, 6]) == 1.0  # 3 four-grams, all different
    assert distinct_ngram_ratio([9] * 10) == 1 / 7  # 7 four-grams, one distinct
    assert distinct_ngram_ratio([1, 2] * 4) == 2 / 5  # (1,2,1,2) and (2,1,2,1) among 5
    assert distinct_ngram_ratio([1, 2, 3]) == distinct_ngram_ratio([]) == 1.0  # no 4-gram: nothing repeats


def test_degenerate_means_a_ratio_below_three_tenths():
    assert is_degenerate([9] * 10) and is_degenerate([1, 2, 3] * 10)  # 1/7; 3/27
    exactly = [1, 2, 3] * 4 + [1]  # 10 four-grams, 3 distinct: 0.3, not below
    assert distinct_ngram_ratio(exactly) == pytest.approx(0.3) and not is_degenerate(exactly)
    assert not is_degenerate([1, 2, 3]) and not is_degenerate(list(range(20)))


def test_tau_histogram_and_per_position_acceptance():
    lengths = [1, 3, 4, 4]  # block 4: slot 1 rejected; slots 1-2 kept, 3 rejected; all kept, twice
    runs = [made_up_run([0, 1], lengths[:1], 0.2, 0.1, {"draft": 0.05, "verify": 0.05}),
            made_up_run(list(range(12)), lengths[1:], 0.4, 0.1, {"draft": 0.1, "verify": 0.2})]
    pooled = loop_figures(runs, 4)  # over every step of both runs, not a mean of their taus (1 and 11/3)
    assert pooled["tau"] == 3.0 and pooled["acceptance_histogram"] == acceptance_histogram(lengths, 4)
    assert acceptance_histogram(lengths, 4) == [1, 0, 1, 2]
    # slot 1: reached 4 times, kept 3; slot 2: reached 3, kept 3; slot 3: reached 3, kept 2
    assert per_position_acceptance(lengths, 4) == [3 / 4, 1.0, 2 / 3]
    assert per_position_acceptance([1, 1], 4) == [0.0, None, None]  # slots 2 and 3 never reached
    assert per_position_acceptance([], 4) == [None] * 3
    assert loop_figures([made_up_run([5], [], 0.1, 0.1, {"decode": 0.0})])["tau"] is None  # no step: no tau


def test_efficiency_is_the_measured_share_of_the_ideal_speedup():
    # tau 4, a decode step of 1 ms, draft + verify 1 ms per step: ideally 4x
    assert ideal_speedup(4.0, 1.0, 0.25, 0.75) == 4.0
    assert efficiency(3.0, 4.0, 1.0, 0.25, 0.75) == 0.75
    assert efficiency(3.0, 4.0, 1.0, 0.0, 0.0) is None and efficiency(None, 4.0, 1.0, 0.5, 0.5) is None


def made_up_run(new_ids, lengths, seconds, first_token_seconds, phase_seconds) -> Run:
    """A run whose clean and timed passes are one and the same made-up record."""
    result = Generation(new_ids, lengths, seconds, 0.0, first_token_seconds)
    return Run(result, result, phase_seconds, {name: len(lengths) for name in phase_seconds})


REPETITIVE, VARIED = [7] * 17, list(range(17))  # 17 new tokens each: the prefill's, then 16 from steps


def plain_run(ids):  # 16 steps at 0.1 s, after a 0.1 s prefill: 10 tokens/s
    return made_up_run(ids, [1] * 16, 1.7, 0.1, {"decode": 1.6})


def test_all_prompts_and_the_non_degenerate_ones_side_by_side():
    # DFlash on the repetitive prompt: 4 steps of 4 tokens, 40 tokens/s; on the varied one: 8 steps of 2, 20 tokens/s
    fast = [made_up_run(REPETITIVE, [4] * 4, 0.425, 0.025, {"draft": 0.1, "verify": 0.3}),
            made_up_run(VARIED, [2] * 8, 0.85, 0.05, {"draft": 0.2, "verify": 0.56})]
    summary = summarize_row(fast, [plain_run(REPETITIVE), plain_run(VARIED)], temperature=0, block_size=4)
    everything, clean = summary["all"], summary["non_degenerate"]
    assert everything["prompts"] == 2 and everything["tau"] == 32 / 12
    assert everything["tokens_per_second"] == pytest.approx(34 / 1.275)
    assert everything["speedup"] == pytest.approx((34 / 1.275) / 10)
    assert clean["prompts"] == 1 and clean["baseline"]["prompts"] == 1  # the repetitive prompt is left out
    assert clean["tau"] == 2.0 and clean["speedup"] == pytest.approx(2.0)
    assert clean["acceptance_histogram"] == [0, 8, 0, 0] and clean["per_position_acceptance"] == [1.0, 0.0, None]
    # per step: draft 25 ms, verify 70 ms, the rest 40 ms / 8; the plain loop's decode step 100 ms
    assert clean["per_step_ms"] == pytest.approx({"draft": 25.0, "verify": 70.0, "accept_and_bookkeeping": 5.0})
    assert clean["ideal_speedup"] == pytest.approx(2.0 * 100 / 95)
    assert clean["efficiency"] == pytest.approx(2.0 / (2.0 * 100 / 95))
    assert clean["baseline"]["time_per_output_token_ms"] == pytest.approx(100.0)
    assert clean["first_token_ms"] == pytest.approx(50.0)
    assert clean["decode_speedup"] == pytest.approx(100.0 / (800 / 16))  # 100 ms per token after the first vs 50


def test_above_temperature_zero_both_loops_are_compared_on_one_prompt_set():
    """A prompt counts as non-degenerate when neither loop's output is: one set for both sides of a speedup."""
    fast = [made_up_run(VARIED, [4] * 4, 0.425, 0.025, {"draft": 0.1, "verify": 0.3}),
            made_up_run(VARIED, [2] * 8, 0.85, 0.05, {"draft": 0.2, "verify": 0.56})]
    baseline = [plain_run(REPETITIVE), plain_run(VARIED)]
    assert summarize_row(fast, baseline, temperature=0, block_size=4)["non_degenerate"]["prompts"] == 1
    sampled = summarize_row(fast, baseline, temperature=0.7, block_size=4)["non_degenerate"]
    assert sampled["prompts"] == 1 and sampled["baseline"]["prompts"] == 1


def test_figures_of_no_prompt_at_all_are_empty_not_an_error():
    summary = summarize_row([made_up_run(REPETITIVE, [4] * 4, 0.4, 0.0, {"draft": 0.1, "verify": 0.2})],
                            [plain_run(REPETITIVE)], temperature=0, block_size=4)
    assert summary["non_degenerate"]["prompts"] == 0 and summary["non_degenerate"]["speedup"] is None
    assert loop_figures([]) == {"prompts": 0}


# ------------------------------------------------------------- runs on the fixture pair


@pytest.fixture(scope="module")
def loops():
    target = Qwen3.from_pretrained(TARGET)
    drafter = Drafter.from_pretrained(DRAFTER, target=target)
    max_length = max(map(len, PROMPTS)) + NEW_TOKENS + 2 * 8
    return Loops(target, drafter, stop_ids=[], seed=0, max_new_tokens=NEW_TOKENS, max_length=max_length,
                 engine=generate)


def test_the_oracle_accepts_every_block_whole(loops):
    prompts = [BenchPrompt(f"prompt {i}", ids) for i, ids in enumerate(PROMPTS)]
    baselines, rows = bench.benchmark(loops, prompts, [8], [0.0], oracle=True)
    oracle = next(row for row in rows if row.kind == "oracle")
    for run, plain in zip(oracle.runs, baselines[Sampling()]):
        for result in (run.result, run.timed):
            assert result.acceptance_lengths == [8, 8, 8]
            assert result.new_ids == plain.result.new_ids  # the oracle's drafts are the target's own tokens
        assert run.phase_calls == {"draft": 3, "verify": 3} and run.bookkeeping_seconds >= 0
        assert plain.phase_calls == {"decode": NEW_TOKENS - 1}
    summary = summarize_row(oracle.runs, oracle.baseline, 0.0, 8)["all"]
    assert summary["tau"] == 8.0 and summary["per_position_acceptance"] == [1.0] * 7
    assert summary["acceptance_histogram"] == [0] * 7 + [3 * len(PROMPTS)]
    assert not {"draft", "verify", "decode"} & set(loops.runner("DFlash", 8).__dict__)  # no method swapped
    assert type(loops.runner("DFlash", 8)) is ModelRunner  # the chain is measured on the runner as generate.py has it


def prompt_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n" for ids in PROMPTS))
    return path


def test_json_report_has_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    plots = importlib.util.find_spec("matplotlib") is not None
    argv = [*PAIR, "--prompts", str(prompt_file(tmp_path)), "--max-new-tokens", str(NEW_TOKENS),
            "--block-sizes", "8", "--json", str(out)] + (["--plots", str(tmp_path / "plots")] if plots else [])
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    conditions = report["conditions"]
    for key in ("machine", "torch", "threads", "device", "dtype", "compile", "batch_size", "prompts",
                "max_new_tokens", "block_sizes", "temperatures", "seed", "token_healing"):
        assert key in conditions
    assert conditions["prompts"] == len(PROMPTS) and conditions["batch_size"] == 1
    assert report["peak_memory"]["bytes"] > 0 and report["peer"] is None
    [baseline] = report["baselines"]
    assert baseline["all"]["per_step_ms"]["decode"] > 0 and len(baseline["per_prompt"]) == len(PROMPTS)
    rows = {row["kind"]: row for row in report["rows"]}
    assert set(rows) == {"DFlash", "oracle"}
    for row in rows.values():
        for half in ("all", "non_degenerate"):
            assert {"prompts", "tau", "tokens_per_second", "speedup", "efficiency", "ideal_speedup", "first_token_ms",
                    "time_per_output_token_ms", "per_step_ms", "acceptance_histogram", "per_position_acceptance",
                    "baseline"} <= set(row[half]) or row[half]["prompts"] == 0
        assert set(row["all"]["per_step_ms"]) == {"draft", "verify", "accept_and_bookkeeping"}
        for p in row["per_prompt"]:
            assert p["identical_to_baseline"] and 0 < p["distinct_4gram_ratio"] <= 1
            assert p["degenerate"] == (p["baseline_distinct_4gram_ratio"] < 0.3)
    assert rows["oracle"]["all"]["tau"] == 8.0 and rows["DFlash"]["per_prompt"][0]["oracle_tau"] == 8.0
    if plots:
        assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
            "acceptance_histogram.png", "per_position_acceptance.png", "speedup_per_prompt.png"]


def test_bad_input_is_one_error_line(tmp_path, capsys):
    assert bench.main([*PAIR, "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "missing.jsonl" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_peer_without_transformers_is_one_error_line(tmp_path, capsys):
    assert bench.main([*PAIR, "--prompts", str(prompt_file(tmp_path)), "--peer", "transformers"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "[peer]" in err[0]


def test_an_option_whose_extra_is_missing_is_refused():
    with pytest.raises(UsageError, match=r"pip install -e '\.\[plots\]'"):
        bench.require("no_such_module_at_all", "plots", "--plots")


def test_accuracy_counts_replies_whose_last_number_is_the_answer():
    assert measure.final_number("First 3 * 6 = 18. Then 18 + 2 = 20. The answer is 20.") == "20"
    assert measure.final_number("no number here") is None and measure.final_number("a loss of -4") == "-4"
    runs = [plain_run(VARIED), plain_run(VARIED), plain_run(VARIED)]
    runs[0].correct, runs[1].correct = True, False  # the third prompt has no known answer
    assert measure.accuracy(runs) == 0.5 and loop_figures(runs)["accuracy"] == 0.5
    assert measure.accuracy(runs[2:]) is None


# ------------------------------------------------------------- what the benchmarks share


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_peak_memory_restarts_and_counts_what_is_touched():
    cpu = torch.device("cpu")
    bench_common.reset_peak_memory(cpu)
    held = bench_common.peak_memory(cpu)
    block = torch.ones(2**24)  # 64 MiB, every page written
    assert bench_common.peak_memory(cpu) - held >= 60 * 2**20
    del block
    bench_common.reset_peak_memory(cpu)
    assert bench_common.peak_memory(cpu) - held < 32 * 2**20  # the peak follows what is held now


def test_random_weights_are_small_with_unit_norms():
    model = init_weights(Qwen3.from_pretrained(TARGET))
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            assert bool((parameter == 1).all()), name
        else:
            assert 0.015 < float(parameter.std()) < 0.025, name


def test_a_table_right_aligns_ratios_and_missing_values(capsys):
    bench_common.print_table("title", [("a", "s"), ("ratio", ".2fx")], [["x", 1.234], ["yy", None]])
    assert capsys.readouterr().out == "\ntitle\n   a ratio\n   x 1.23x\n  yy     -\n"


def test_draft_policies_and_filters_are_compared_against_a_plain_loop_sampling_alike(tmp_path):
    """One run on the demo pair: each policy and filter set (the checkpoint's top-k 20, top-p 0.8) gets its row."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [1, 2, 3 + i]}) + "\n" for i in range(2)))
    report = tmp_path / "report.json"
    code = bench.main(["--prompts", str(prompts), "--block-sizes", "4", "--temperatures", "0", "1.0",
                       "--draft-policy", "greedy", "sampled", "mixed:2", "--filters", "none", "config",
                       "--max-new-tokens", "8", "--no-oracle", "--json", str(report)])
    assert code == 0
    rows, baselines = (json.loads(report.read_text())[key] for key in ("rows", "baselines"))
    sampled_rows = {(r["policy"], r["filters"]) for r in rows if r["temperature"] == 1.0}
    assert sampled_rows == {(p, f) for p in ("greedy", "sampled", "mixed:2") for f in ("", "k20 p0.8")}  # the demo's
    assert {(b["temperature"], b["filters"]) for b in baselines} == {(0, ""), (1.0, ""), (1.0, "k20 p0.8")}
    assert [r["policy"] for r in rows if r["temperature"] == 0] == ["greedy"]  # greedy has one policy


def test_a_policy_that_samples_is_refused_at_temperature_zero(capsys):
    code = bench.main(["--model", str(FIXTURES / "qwen3-tiny-sharded"), "--draft", str(FIXTURES / "dflash-tiny"),
                       "--temperatures", "0", "--draft-policy", "sampled"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ")


def test_compile_option_reads_as_before_and_both_runs_each_mode():
    parser = bench.build_parser()
    assert parser.parse_args([]).compile is None  # the device decides
    assert parser.parse_args(["--compile"]).compile == "on" and parser.parse_args(["--no-compile"]).compile == "off"
    assert parser.parse_args(["--compile", "both"]).compile == "both"


def test_every_loop_is_also_compared_with_the_fastest_plain_loop_of_its_sampling():
    def report(kind, compiled, speed, temperature=0.0):
        halves = {half: {"tokens_per_second": speed} for half in ("all", "non_degenerate")}
        return {"kind": kind, "compiled": compiled, "temperature": temperature, "filters": "", **halves}

    reports = [report("plain", False, 100.0), report("DFlash", False, 250.0), report("plain", True, 200.0),
               report("DFlash", True, 300.0), report("plain", False, 50.0, 0.7), report("DFlash", False, 120.0, 0.7)]
    bench.add_speedup_over_fastest_plain(reports)
    assert [r["all"]["speedup_over_fastest_plain"] for r in reports] == [0.5, 1.25, 1.0, 1.5, 1.0, 2.4]


def test_pass_costs_fits_overhead_and_per_token_cost():
    import pass_costs

    fit = pass_costs.fit_line([(1, 1.3), (2, 1.5), (4, 1.9), (8, 2.7), (16, 4.3)])
    assert fit["overhead"] == pytest.approx(1.1) and fit["per_token"] == pytest.approx(0.2)
    assert pass_costs.build_parser().parse_args([]).tokens == [2, 4, 8, 16]
