"""docs/options.md is what the options' declarations say: regenerated, it is the same file."""

from __future__ import annotations

from pathlib import Path

from lrl.config import OPTIONS
from lrl_lab.tools.options_doc import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_page_is_generated_from_the_declarations():
    text = markdown()
    assert (ROOT / "docs" / "options.md").read_text() == text, (
        "docs/options.md is out of date: python -m lrl_lab.tools.options_doc > docs/options.md"
    )
    for name in OPTIONS:  # the check looked at what it meant to
        assert f"| `{name}` |" in text
