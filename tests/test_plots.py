"""plots and report: every figure from a seed-shaped ladder, OOM points marked, partial
and empty ladders drawn without failing, the report's tables."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from conftest import write_rung
from scaleladder.figures import plots
from scaleladder.figures import report
from scaleladder.figures.max_batch import fig_max_batch
from scaleladder.figures.pareto import pareto_front
from scaleladder.figures.style import Palette
from scaleladder.figures.throughput_by_model import fig_throughput_by_model
from scaleladder.figures.weak_scaling import fig_weak_scaling
from scaleladder.results.aggregate import aggregate, read_ladder
from scaleladder.cli import main as cli

PNG = b"\x89PNG\r\n\x1a\n"


def _ladder(tmp_path: Path, files: list[Path]) -> Path:
    out = tmp_path / "ladder.h5"
    aggregate([str(f) for f in files], str(out))
    return out


def _texts(fig: plt.Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_every_figure_png_and_pdf_from_a_seed_shaped_ladder(seed_ladder: tuple[Path, list[Path]]) -> None:
    root, files = seed_ladder
    ladder = _ladder(root, files)
    assert cli(["plots", "--ladder", str(ladder), "--out-dir", str(root / "plots")]) == 0
    for name in plots.FIGURES:
        png, pdf = root / "plots" / f"{name}.png", root / "plots" / f"{name}.pdf"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000, name
        assert pdf.read_bytes()[:4] == b"%PDF", name


def test_oom_rungs_are_marked_not_dropped(seed_ladder: tuple[Path, list[Path]]) -> None:
    root, files = seed_ladder
    rungs, _ = read_ladder(str(_ladder(root, files)))
    pal = Palette(rungs)
    fig = fig_throughput_by_model(rungs, pal)
    # flava-1.8b and flava-10b DDP ran out of memory and flava-10b FSDP was predicted not
    # to fit, at batch 8 and at max: 6 marks, the 2 predictions told apart
    assert _texts(fig).count("OOM") == 4 and _texts(fig).count("pred. OOM") == 2
    fig = fig_max_batch(rungs, pal)
    assert _texts(fig).count("OOM") == 2 and _texts(fig).count("pred. OOM") == 1
    plt.close("all")


def test_weak_scaling_draws_the_ideal_line_from_the_first_point(seed_ladder: tuple[Path, list[Path]]) -> None:
    root, files = seed_ladder
    rungs, _ = read_ladder(str(_ladder(root, files)))
    fig = fig_weak_scaling(rungs, Palette(rungs))
    ax = fig.axes[0]  # vit-base throughput
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert dashed and solid
    x, y = dashed[0].get_data()
    assert list(x) == [1, 2, 4, 8] and y[3] == pytest.approx(8 * y[0])
    plt.close("all")


@pytest.mark.parametrize(
    "specs",
    [
        [],  # nothing at all
        [("vit-debug/ddp/fp32/pre-lag/n1/b8", "oom")],  # only an OOM
        [("vit-debug/ddp/fp32/pre-lag/n1/b8", "ok")],  # one point: no max batch, no knobs, no scaling
        [("flava-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax", "predicted-oom"), ("flava-debug/ddp/fp32/pre-lag/n1/b8", "ok")],
    ],
)
def test_partial_ladders_still_draw(tmp_path: Path, specs: list[tuple[str, str]]) -> None:
    files = [write_rung(tmp_path, s, status=st, peak_reserved_gib=0.0) for s, st in specs]
    if files:
        rungs, _ = read_ladder(str(_ladder(tmp_path, files)))
    else:
        rungs = []
    written = plots.draw_all(rungs, str(tmp_path / "plots"))
    assert len(written) == 2 * len(plots.FIGURES)


def test_pareto_front() -> None:
    pts = [(10, 100), (20, 90), (20, 150), (5, 50), (30, 150), (40, 200)]
    assert pareto_front(pts) == [(5, 50), (10, 100), (20, 150), (40, 200)]


def test_report_html_and_markdown(seed_ladder: tuple[Path, list[Path]]) -> None:
    root, files = seed_ladder
    ladder = _ladder(root, files)
    plots.draw_all(read_ladder(str(ladder))[0], str(root / "results" / "plots"))
    html, md = root / "results" / "report.html", root / "results" / "report.md"
    assert cli(["report", "--ladder", str(ladder), "--plots", str(root / "results" / "plots"),
                "--html", str(html), "--md", str(md)]) == 0
    h, m = html.read_text(), md.read_text()
    for name in plots.FIGURES:  # figures linked relative to the page
        assert f"plots/{name}.png" in h and f"plots/{name}.png" in m
    assert h.count("<tr class='oom'>") == 8  # 6 oom + 2 predicted-oom rungs, all in the table
    assert "max = 60" in m  # a max-batch rung shows the batch it settled on
    rows = {w["model"]: w for w in report.winners(read_ladder(str(ladder))[0])}
    assert rows["flava-10b"]["fastest"].startswith("FSDP FULL_SHARD + AC")
    assert "DDP" in rows["flava-10b"]["out of memory"]
    assert cli(["report", "--ladder", str(ladder), "--plots", "x"]) == 2  # no output asked for


def test_fsdp2_and_compiled_rungs_are_named_and_sit_beside_fsdp1() -> None:
    from scaleladder.figures.style import knobs_label, strategy_label, strategy_sort_key

    assert strategy_label("fsdp2-full-ac-compile") == "FSDP2 FULL_SHARD + AC + compile"
    assert strategy_label("fsdp2-hybrid2") == "HSDP 2 GPUs" and strategy_label("fsdp-hybrid2") == "HYBRID 2 GPUs"
    assert knobs_label("pf0") == "implicit prefetch" and knobs_label("pf2") == "prefetch 2 layers"
    order = sorted(["fsdp2-full", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp2-grad-op"], key=strategy_sort_key)
    assert order == ["ddp", "fsdp-grad-op", "fsdp2-grad-op", "fsdp-full", "fsdp2-full"]


def test_the_report_shows_compile_time_for_compiled_rungs_only() -> None:
    from scaleladder.figures.report import COLUMNS, _cell

    assert ("compile_s", "compile s") in COLUMNS
    assert _cell({"compile_s": 12.34}, "compile_s") == "12.34"
    assert _cell({"compile_s": float("nan")}, "compile_s") == "-"  # an eager rung: never measured
    assert _cell({}, "compile_s") == "-"
