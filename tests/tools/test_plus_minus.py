"""Every "±" the pages quote says what it is: a standard error, or the half-width of an interval (and which)."""

import re

from lrl_lab.experiments import render

BAR = re.compile(r"\d ± \d")  # an error bar ("0.97 ± 0.01"); "within ±10%" is a tolerance, not one
LABEL = re.compile(r"\bSE\b|standard error|95%|\binterval\b|half-width|Student", re.I)
PAGE = "± on this page:"  # a page that says once what its ± are


def unlabelled(text: str) -> list[str]:
    """The paragraphs of a page with an error bar and no word on what it is (in the paragraph, in the one before it
    where the paragraph is a table under its caption, or once for the page)."""
    if PAGE in text:
        return []
    paragraphs = re.split(r"\n\s*\n", text)
    found = []
    for i, para in enumerate(paragraphs):
        if not BAR.search(para) or LABEL.search(para):
            continue
        if para.lstrip().startswith("|") and i and LABEL.search(paragraphs[i - 1]):
            continue
        found.append(para.strip()[:120])
    return found


def test_every_error_bar_of_the_pages_says_what_it_is():
    found = {}
    for page in render.pages():
        if "records" in page.relative_to(render.ROOT).parts:
            continue  # the records' tables say it in their captions (decide_tables)
        if missing := unlabelled(page.read_text()):
            found[str(page.relative_to(render.ROOT))] = missing
    assert not found, found


def test_a_bare_error_bar_is_found_and_a_labelled_one_is_not():
    assert unlabelled("It ends at 0.97 ± 0.01.\n") == ["It ends at 0.97 ± 0.01."]
    assert unlabelled("It ends at 0.97 ± 0.01 (mean ± SE).\n") == []
    assert unlabelled("Held-out, 95% t interval:\n\n| row | x |\n| --- | --- |\n| a | 0.9 ± 0.1 |\n") == []
    assert unlabelled("Within ±10% of the target.\n") == []
    assert unlabelled(f"{PAGE} standard errors.\n\nIt ends at 0.97 ± 0.01.\n") == []
