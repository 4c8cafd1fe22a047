"""Every relative link in the pages a newcomer reads points to a file that exists, and every
`#anchor` to a heading of its page: the README and docs/results.md moved text between them, and a
link that breaks silently sends a reader nowhere."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/results.md", "docs/training.md", "docs/glossary.md",
         "weights/README.md", "tutorials/README.md"]
FENCED = re.compile(r"^```.*?^```", re.M | re.S)  # code blocks: their brackets are not links
CODE = re.compile(r"`[^`\n]*`")  # code spans, inside a link's text or not
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, code blocks left out."""
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    return {anchor(CODE.sub(lambda span: span.group()[1:-1], h)) for h in HEADING.findall(text)}


def broken_links(page: Path) -> list[str]:
    """`target` for each relative link of `page` whose file is missing, or whose #anchor is no
    heading of the page it names; web addresses are not followed."""
    text = CODE.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(target)
    return broken


@pytest.mark.parametrize("name", PAGES)
def test_every_relative_link_points_to_something_that_exists(name):
    assert broken_links(ROOT / name) == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("# Results\n\n## Sampling: policies, measured\n")
    page = tmp_path / "README.md"
    page.write_text(
        "![step](docs/step.png) [`results`](docs/results.md) [here](#results-of-nothing)\n"
        "[ok](docs/results.md#sampling-policies-measured) [no](docs/results.md#sampling)\n"
        "```\n[not a link](nowhere.md)\n```\n[web](https://example.org/x)\n"
    )
    missing = ["docs/step.png", "#results-of-nothing", "docs/results.md#sampling"]
    assert broken_links(page) == missing
