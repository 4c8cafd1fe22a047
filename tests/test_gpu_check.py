"""The GPU check at tiny sizes on the CPU (its `--cpu-smoke` mode), as CI can run it: a section
that fails leaves every other section's figures in report.json, and the deadline skips sections
and says so; and the parts of the report no CPU run exercises, each made to happen."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpu_check

ROOT = Path(__file__).resolve().parents[1]


def recompiling_section(check):
    """A section that fails as a real one may: a recompile under `error_on_recompile`."""
    torch._dynamo.config.error_on_recompile = True
    double = torch.compile(lambda x: 2 * x, backend="eager", dynamic=False)
    double(torch.ones(2))
    double(torch.ones(3))  # a new shape: a recompile, made an error


def smoke_args(tmp_path, *options):
    return gpu_check.build_parser().parse_args(["--out", str(tmp_path), "--cpu-smoke", *options])


def test_a_failing_section_leaves_the_other_sections_figures(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.SECTIONS, "recompiles", recompiling_section)
    tf32 = gpu_check.tf32_state()
    sections = "parity,recompiles,lossless,sdpa,host_loop,step_costs,training"
    status = gpu_check.main(smoke_args(tmp_path, "--sections", sections))
    assert status == 1  # a failed section fails the run...
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["sections"]) == sections.split(",")
    failed = report["sections"]["recompiles"]
    assert failed["status"] == "failed" and failed["error_type"].endswith("RecompileError")
    assert "recompiling_section" in failed["traceback"] and failed["compile"]["graphs"] == 1
    # ... and every section after it ran, the compiled ones too (dynamo was reset after it).
    results = {name: entry["result"] for name, entry in report["sections"].items()
               if name != "recompiles"}
    assert all(report["sections"][name]["status"] == "ok" for name in results)
    assert results["parity"]["passed"] and results["lossless"]["all identical"]
    assert report["sections"]["lossless"]["compile"]["graphs"] > 0
    assert report["sections"]["lossless"]["compile"]["recompiles"] == 0
    calls = results["sdpa"]["calls"]
    assert {"eager", "fixed shape"} == set(calls)
    passes = {call["pass"] for call in calls["fixed shape"]}
    assert {"plain: decode", "chain: draft", "chain: verify", "tree: verify"} <= passes
    assert all(call["backend"]["chosen"] in ("flash_attention", "math") for call in calls["eager"])
    loop = results["host_loop"]
    assert loop["steps"] > 0 and set(loop["device ms per step"]) == {"draft", "verify"}
    assert math.isfinite(loop["host ms per step"])
    row = results["step_costs"]["rows"][0]
    assert row["plain tokens/s"] > 0 and set(row["verify/decode"]) == {"4", "8", "16"}
    for path in ("fast", "dense"):
        trained = results["training"]["paths"][path]
        assert math.isfinite(trained["first-step loss"]) and trained["attention"]
    assert results["training"]["paths"]["fast"]["attention"]["q, k, v dtypes"] == ["float32"] * 3
    for entry in report["sections"].values():
        assert entry["seconds"] > 0 and "peak memory (MiB)" in entry
    assert report["environment"]["torch"] == torch.__version__
    assert report["tf32 at end"] == report["tf32 at start"] == tf32 == gpu_check.tf32_state()
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("# GPU check") and "## recompiles: failed" in markdown


def test_the_deadline_skips_the_sections_left_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.SECTIONS, "slow", lambda _: time.sleep(1.5) or {"slept": True})
    args = smoke_args(tmp_path, "--sections", "slow,parity,lossless", "--deadline", "1")
    assert gpu_check.main(args) == 0
    sections = json.loads((tmp_path / "report.json").read_text())["sections"]
    assert sections["slow"]["status"] == "ok" and sections["slow"]["result"] == {"slept": True}
    skipped = [sections[name] for name in ("parity", "lossless")]
    assert skipped == [{"status": "skipped: deadline"}] * 2
    assert "## lossless: skipped: deadline" in (tmp_path / "report.md").read_text()


def run_script(*options):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *options],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_script_reports_even_when_it_runs_nothing(tmp_path):
    done = run_script("--out", str(tmp_path), "--cpu-smoke", "--deadline", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["sections"]) == set(gpu_check.DEFAULT_SECTIONS)
    assert all(entry == {"status": "skipped: deadline"} for entry in report["sections"].values())


def test_an_unknown_section_is_one_error_line(tmp_path):
    done = run_script("--out", str(tmp_path), "--cpu-smoke", "--sections", "parity,nope")
    assert done.returncode == 2 and done.stderr.startswith("error:") and "nope" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


class LargestFloat32(TorchDispatchMode):
    """The most elements of any float32 tensor an operation inside made."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            self.largest = max(self.largest, out.numel())
        return out


def test_the_real_shapes_are_built_in_bf16_from_the_start():
    """On the meta device, so nothing is allocated: no float32 tensor bigger than RoPE's frequencies
    is ever made, and every parameter is bf16."""
    with LargestFloat32() as made:
        target, drafter = gpu_check.random_pair(gpu_check.SHAPES["Qwen3-8B"], "meta",
                                                torch.bfloat16)
    assert made.largest <= 64  # inv_freq: head_dim / 2 float32 numbers
    assert 8.1e9 < sum(p.numel() for p in target.parameters()) < 8.3e9  # Qwen3-8B's 8.19 B
    for model in (target, drafter):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert model.rotary.inv_freq.dtype == torch.float32  # RoPE's frequencies stay exact
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_cudagraph_skips_are_counted_with_their_reasons():
    """Inductor says why it skips CUDA graphs through one function; no CPU run calls it."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    watch = gpu_check.CompileWatch()
    with gpu_check.CudagraphSkips() as skips:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (a test)")
    report = watch.report(skips.reasons)
    assert report["cudagraph skips"] == 1
    assert report["cudagraph skip reasons"] == [
        "skipping cudagraphs due to mutated inputs (a test)"]


def test_a_mismatch_says_where_and_how_close_the_target_was():
    """No CPU run disagrees, so a disagreement is made: one token of the plain output changed."""
    from dflash.qwen3 import Qwen3
    from generate import generate_autoregressive

    target = Qwen3.from_pretrained(ROOT / "tests" / "fixtures" / "qwen3-tiny")
    prompt = [1, 2, 3]
    plain = generate_autoregressive(target, prompt, 5).new_ids
    fast = plain[:2] + [(plain[2] + 1) % target.config.vocab_size] + plain[3:]
    found = gpu_check.first_mismatch(target, prompt, plain, fast)
    assert found["first differing new token"] == 2
    assert (found["plain"], found["dflash"]) == (plain[2], fast[2])
    assert found["target's top two"][0] == plain[2] and found["top-two logit gap"] >= 0
    assert gpu_check.first_mismatch(target, prompt, plain, plain) is None
