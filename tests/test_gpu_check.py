"""The GPU check runs end to end at tiny sizes on the CPU (its `--cpu-smoke` mode), as CI can."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_smoke_run_writes_a_passing_report(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                           "--cpu-smoke"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["correctness"]["lossless in float32"] and report["correctness"]["fixture parity"]["passed"]
    row = report["step costs"][0]
    assert row["plain tokens/s"] > 0 and set(row["verify/decode"]) == {"4", "8", "16"}
    assert (tmp_path / "report.md").read_text().startswith("# GPU check")
