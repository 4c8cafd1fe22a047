"""What a set of files and folders holds, byte for byte, to compare before and after a program that must not
touch them (a refusal deletes, truncates and creates nothing)."""

from pathlib import Path


def tree_bytes(*paths: Path) -> dict[str, bytes | None]:
    """Every file under `paths` (a file or a folder), by path, with its bytes; a folder's own entry is None, so a
    folder made or removed shows too."""
    found: dict[str, bytes | None] = {}
    for path in map(Path, paths):
        if path.is_dir():
            found[str(path)] = None
            for inner in sorted(path.rglob("*")):
                found[str(inner)] = inner.read_bytes() if inner.is_file() else None
        elif path.exists():
            found[str(path)] = path.read_bytes()
    return found


def assert_untouched(before: dict[str, bytes | None], *paths: Path) -> None:
    """The files under `paths` are as `before` (a `tree_bytes` of the same paths): nothing changed, added or lost."""
    after = tree_bytes(*paths)
    lost, added = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    assert not (lost or added or changed), f"lost {lost}, added {added}, changed {changed}"
