"""The import rule: the package never stands on a top-level script."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dflash"
TOP_LEVEL_SCRIPTS = {path.stem for path in ROOT.glob("*.py")}  # generate, train, bench, make_data...


def imported_modules(source: Path) -> set[str]:
    """The first component of every module a file imports, at any depth of its code."""
    tree = ast.parse(source.read_text(), filename=str(source))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_scripts_are_found():
    assert {"generate", "train"} <= TOP_LEVEL_SCRIPTS


def test_no_module_of_the_package_imports_a_top_level_script():
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in imported_modules(path) & TOP_LEVEL_SCRIPTS
    }
    assert not offenders


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from generate import sample\n")
    assert "generate" in imported_modules(bad) & TOP_LEVEL_SCRIPTS


# ------------------------------------------------ narrow signatures on the reading path

MAX_POSITIONAL = 6  # past this, options are keyword-only and named at every call


def wide_signatures(source: Path) -> list[str]:
    """Every function in `source` taking more than MAX_POSITIONAL positional parameters (self, cls and an
    autograd Function's ctx not counted: the caller never passes them)."""
    wide = []
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            named = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls", "ctx")]
            if len(named) > MAX_POSITIONAL:
                wide.append(f"{source.relative_to(ROOT)}:{node.lineno} {node.name}({', '.join(named)})")
    return wide


def test_no_function_of_the_library_or_the_loops_takes_more_than_six_positional_parameters():
    sources = sorted(PACKAGE.glob("*.py")) + [ROOT / "generate.py", ROOT / "train.py"]
    assert [wide for source in sources for wide in wide_signatures(source)] == []


def test_the_signature_rule_catches_a_wide_function(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(a, b, c, d, e, f, g):\n    pass\n\ndef ok(self, a, b, c, d, e, f, *, g):\n    pass\n")
    assert [line.split(" ", 1)[1] for line in wide_signatures_in(bad)] == ["f(a, b, c, d, e, f, g)"]


def wide_signatures_in(source: Path) -> list[str]:
    """`wide_signatures` for a file outside the repository (the rule's own test)."""
    global ROOT
    saved, ROOT = ROOT, source.parent
    try:
        return wide_signatures(source)
    finally:
        ROOT = saved


def test_the_model_runner_has_no_base_class():
    runner = next(node for node in ast.parse((ROOT / "generate.py").read_text()).body
                  if isinstance(node, ast.ClassDef) and node.name == "ModelRunner")
    assert runner.bases == []


def test_the_reading_path_stays_within_its_length():
    """The five files a reader follows one DFlash step through (the loops, training, the target, the drafter, draft
    trees) stay within the 1,600 lines the project aims at: past it, code belongs in a module of its own."""
    files = ["generate.py", "train.py", "dflash/qwen3.py", "dflash/drafter.py", "dflash/tree.py"]
    lines = sum(len((ROOT / name).read_text().splitlines()) for name in files)
    assert lines <= 1600, f"the reading path is {lines} lines"
