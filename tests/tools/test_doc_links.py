"""Every link of the README and the docs to a file of the repository leads to one (pages and results move)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_links(page: Path) -> list[str]:
    """The targets of `page`'s markdown links that are files of the repository (no web address, no anchor alone)."""
    targets = [t.split("#")[0] for t in LINK.findall(page.read_text())]
    return [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]


def test_every_link_of_the_readme_and_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        (str(p.relative_to(ROOT)), t) for p in pages for t in local_links(p) if not (p.parent / t).exists()
    ]
    assert not broken, f"links to nothing: {broken}"
    assert "docs/results/README.md" in local_links(ROOT / "README.md")  # the check read what it meant to


def test_the_link_reader_finds_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](x.md) ![b](img/y.png) [c](https://example.org) [d](#top) [e](z.md#part)\n")
    assert local_links(page) == ["x.md", "img/y.png", "z.md"]
