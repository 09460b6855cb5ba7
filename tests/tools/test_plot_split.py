"""The figure of a run's mismatch split (python -m lrl_lab.tools.plot_run RUN --split)."""

from __future__ import annotations

import pytest

from lrl_lab.tools.plot_run import SPLIT_PARTS, main, plot_split


def write_run(folder, tags):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for step in range(0, 9, 3):
        for tag in tags:
            writer.add_scalar(tag, 0.01 * (step + 1), step)
    writer.close()


def test_the_split_figure_is_drawn_from_the_parts_and_refused_without_them(tmp_path):
    split = tmp_path / "split"
    names = [f"mismatch/part/{p}{s}" for p in SPLIT_PARTS for s in ("", "_abs")]
    write_run(split, names + ["mismatch/part/total", "mismatch/part/total_abs", "mismatch/part/explained"])
    out = plot_split(split, tmp_path / "figs" / "split.png")
    assert out.is_file() and out.read_bytes().startswith(b"\x89PNG")

    plain = tmp_path / "plain"
    write_run(plain, ["train/reward", "mismatch/abs_mean"])
    with pytest.raises(SystemExit, match="no mismatch split"):
        plot_split(plain, tmp_path / "none.png")
    assert main([str(split), "--split", "--out", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 0
