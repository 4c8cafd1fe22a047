"""One training step, traced: which project files a reader must open to follow it. A step is the
recipe (train.py), the loop's helpers (dflash/training.py), the two models (dflash/qwen3.py,
dflash/drafter.py) and the fast attention and loss (dflash/train_kernels.py): at most five files,
and never a top-level script besides train.py (make_data.py, generate.py)."""

import ast
import json
import sys
from pathlib import Path

import torch

import train
from dflash.training import Distributed

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "qwen3-tiny"


def project_files_called(run_one_step) -> dict[str, set[str]]:
    """{file relative to the repository: the functions called in it} for every Python function
    `run_one_step()` calls, found with a profile hook (the tests themselves not counted)."""
    called: dict[str, set[str]] = {}

    def hook(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ROOT) and ".venv" not in path.parts and "tests" not in path.parts:
                called.setdefault(str(path.relative_to(ROOT)), set()).add(frame.f_code.co_qualname)

    sys.setprofile(hook)
    try:
        run_one_step()
    finally:
        sys.setprofile(None)
    return called


def test_one_training_step_opens_at_most_five_project_files(tmp_path):
    torch.manual_seed(0)
    data = tmp_path / "data.jsonl"
    generator = torch.Generator().manual_seed(0)
    data.write_text("".join(json.dumps({"input_ids": torch.randint(0, 512, (20,), generator=generator)
                                        .tolist(), "loss_mask": [0] * 6 + [1] * 14}) + "\n"
                            for _ in range(8)))
    cfg = train.TrainConfig(target=str(TINY), data=str(data), out=str(tmp_path / "run"),
                            drafter_layers=1, block_size=4, num_anchors=4, batch_size=2,
                            grad_accum=2, steps=4, device="cpu")
    run = train.start_run(cfg, Distributed())
    train.train_step(run)  # the first step builds what later steps reuse; trace the second
    called = project_files_called(lambda: train.train_step(run))
    for name, functions in sorted(called.items()):
        print(f"{name}: {len(functions)} functions: {', '.join(sorted(functions))}")
    assert run.step == 2
    assert len(called) <= 5, sorted(called)
    assert not {"make_data.py", "generate.py"} & set(called)
    assert {"train.py", "dflash/drafter.py", "dflash/qwen3.py", "dflash/train_kernels.py"} <= set(called)


def test_train_py_imports_no_top_level_script():
    """What train.py shares with make_data.py and generate.py lives in dflash/: scripts stand on
    the package, never on each other."""
    tree = ast.parse((ROOT / "train.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    scripts = {path.stem for path in ROOT.glob("*.py")}
    assert {"generate", "make_data"} <= scripts and not imported & scripts
