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
