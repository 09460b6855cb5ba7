"""Every records table is what its records render today (lrl_lab.experiments.render), and a number changed in a
record or in a table is found."""

import json
import shutil

import pytest

from lrl_lab.experiments import render

FOLDERS = render.folders()


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_every_records_table_is_what_its_records_render(folder):
    found = render.differences(folder)
    assert not found, "\n".join(found) + "\n(python -m lrl_lab.experiments.render --write, and commit the tables)"


def copy_of(folder, tmp_path):
    """`folder` under a root of its own, at the same relative path its table's command names."""
    here = tmp_path / folder.relative_to(render.ROOT)
    shutil.copytree(folder, here)
    return here


def test_a_number_changed_in_a_record_or_in_a_table_is_found(tmp_path):
    folder = copy_of(render.RECORDS / "calc-t07-icelake-fp32", tmp_path)
    assert render.differences(folder, tmp_path) == []
    results = folder / "results.jsonl"
    original = results.read_text()
    runs = [json.loads(line) for line in original.splitlines()]
    runs[0]["greedy"] = round(runs[0]["greedy"] + 0.125, 6)  # one held-out figure of one run
    results.write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert len(render.differences(folder, tmp_path)) == 1
    results.write_text(original)
    table = folder / "table.md"
    text = table.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| ") and "0.125" in line)
    table.write_text(text.replace(row, row.replace("0.125", "0.126", 1), 1))  # one number of the page
    assert len(render.differences(folder, tmp_path)) == 1


def test_the_blocks_of_a_table_are_read_apart():
    text = "flags A\nTabled again by: cmd a\n\n| a |\n\nflags B\nTabled again by: cmd b\n\n| b |\n| b2 |\n"
    got = render.blocks(text)
    assert [(b.head, b.command, b.text) for b in got] == [("flags A", "cmd a", "| a |\n"),
                                                          ("flags B", "cmd b", "| b |\n| b2 |\n")]  # fmt: skip


PAGES = [p for p in render.pages() if render.FIGURE.search(p.read_text())]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_figure_of_a_page_is_its_records_cell(page):
    found = render.figure_differences(page)
    assert not found, "\n".join(found) + "\n(python -m lrl_lab.experiments.render --write, and commit the pages)"


def test_a_figure_changed_in_a_page_or_in_a_record_is_found_and_a_figure_naming_no_cell_is_named(tmp_path):
    folder = copy_of(render.RECORDS / "calc-t07-icelake-fp32", tmp_path)
    page = tmp_path / "docs" / "page.md"
    spec = 'calc-t07-icelake-fp32 2 rows on-policy "held-out, greedy"'
    runs = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    greedy = [r["greedy"] for r in runs if r["row"] == "on-policy"]
    mean = f"{sum(greedy) / len(greedy):.3f}"  # the cell's mean, computed here from the records themselves
    page.write_text(f"On-policy ends at <!-- figure {spec} mean -->{mean}<!-- /figure --> held-out.\n")
    assert render.figure_differences(page, tmp_path) == []
    page.write_text(page.read_text().replace(mean, "0.999"))  # one number of the page
    found = render.figure_differences(page, tmp_path)
    assert len(found) == 1 and "says '0.999'" in found[0] and f"the records say '{mean}'" in found[0]
    assert render.write_figures(page, tmp_path) == 1 and mean in page.read_text()  # --write puts it back
    first = next(r for r in runs if r["row"] == "on-policy")
    first["greedy"] = round(first["greedy"] + 0.3, 6)  # one held-out figure of one run
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert len(render.figure_differences(page, tmp_path)) == 1
    page.write_text('<!-- figure calc-t07-icelake-fp32 2 rows "no such row" "held-out, greedy" -->1<!-- /figure -->\n')
    (found,) = render.figure_differences(page, tmp_path)
    assert "page.md:1:" in found and "has no row 'no such row'" in found
