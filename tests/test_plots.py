"""plots and report: every figure from a seed-shaped ladder, OOM points marked, partial
and empty ladders drawn without failing, the report's tables."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from conftest import write_rung
from scaleladder.cli import main as cli
from scaleladder.figures import plots, registry, report
from scaleladder.figures.max_batch import fig_max_batch
from scaleladder.figures.pareto import pareto_front
from scaleladder.figures.style import Palette
from scaleladder.figures.throughput_by_model import fig_throughput_by_model
from scaleladder.figures.weak_scaling import fig_weak_scaling
from scaleladder.results.aggregate import aggregate, read_ladder

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
    for name in registry.names("plots"):
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
    assert len(written) == 2 * len(registry.names("plots"))


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
    for name in registry.names("plots"):  # figures linked relative to the page
        assert f"plots/{name}.png" in h and f"plots/{name}.png" in m
    assert h.count("<tr class='oom'>") == 8  # 6 oom + 2 predicted-oom rungs, all in the table
    assert "max = 60" in m  # a max-batch rung shows the batch it settled on
    rows = {w["model"]: w for w in report.winners(read_ladder(str(ladder))[0])}
    assert rows["flava-10b"]["fastest at the fixed batch"].startswith("FSDP FULL_SHARD + AC: 700.0 items/s at batch 8")
    assert "DDP" in rows["flava-10b"]["out of memory"]
    assert cli(["report", "--ladder", str(ladder), "--plots", "x"]) == 2  # no output asked for


def test_fsdp2_and_compiled_rungs_are_named_and_sit_beside_fsdp1() -> None:
    from scaleladder.figures.style import knobs_label, strategy_label, strategy_sort_key

    assert strategy_label("fsdp2-full-ac-compile") == "FSDP2 FULL_SHARD + AC + compile"
    assert strategy_label("fsdp2-hybrid2") == "HSDP 2 GPUs" and strategy_label("fsdp-hybrid2") == "HYBRID 2 GPUs"
    assert knobs_label("pf0") == "implicit prefetch" and knobs_label("pf2") == "prefetch 2 layers"
    # units of k layers (-u<k>): pf<n> counts units; k = 1 is never written, so its labels stay
    assert knobs_label("pf0-u2") == "implicit prefetch, units of 2 layers"
    assert knobs_label("pf1-u4") == "prefetch 1 unit, units of 4 layers" and knobs_label("pf1") == "prefetch 1 layer"
    assert knobs_label("none-nolag-fwd") == "no prefetch, no limit_all_gathers, forward prefetch"
    order = sorted(["fsdp2-full", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp2-grad-op"], key=strategy_sort_key)
    assert order == ["ddp", "fsdp-grad-op", "fsdp2-grad-op", "fsdp-full", "fsdp2-full"]


def test_the_report_shows_compile_time_for_compiled_rungs_only() -> None:
    from scaleladder.figures.report import COLUMNS, _cell

    assert ("compile_s", "compile s") in COLUMNS
    assert _cell({"compile_s": 12.34}, "compile_s") == "12.34"
    assert _cell({"compile_s": float("nan")}, "compile_s") == "-"  # an eager rung: never measured
    assert _cell({}, "compile_s") == "-"


# -- uncertainty -------------------------------------------------------------------


def _ci_ladder(tmp_path: Path, hybrid: tuple[float, float, float], no_shard: tuple[float, float, float]) -> list[dict]:
    files = [write_rung(tmp_path, f"vit-debug/{s}/fp32/pre-lag/n{n}/b4", items_per_s=v * n, items_per_s_ci_low=lo * n,
                        items_per_s_ci_high=hi * n)
             for s, (v, lo, hi) in (("fsdp-hybrid1", hybrid), ("fsdp-no-shard", no_shard)) for n in (1, 2)]
    return read_ladder(str(_ladder(tmp_path, files)))[0]


def test_throughput_bars_and_scaling_lines_carry_their_intervals(tmp_path: Path) -> None:
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    rungs = _ci_ladder(tmp_path, (104.0, 96.0, 112.0), (100.0, 92.0, 108.0))
    fig = fig_throughput_by_model(rungs, Palette(rungs))
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one error bar per measured bar
    spans = sorted(tuple(sorted(b.lines[2][0].get_segments()[0][:, 1])) for b in bars)
    assert spans == [pytest.approx((92.0, 108.0)), pytest.approx((96.0, 112.0))]
    assert "95% interval (docs/metrics.md)" in [t.get_text() for t in fig.legends[0].get_texts()]
    fig = fig_weak_scaling(rungs, Palette(rungs))
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # one band per strategy
    plt.close("all")


def test_the_report_flags_a_fastest_claim_within_noise(tmp_path: Path) -> None:
    rungs = _ci_ladder(tmp_path / "a", (104.0, 96.0, 112.0), (100.0, 92.0, 108.0))
    (row, _) = report.winners(rungs)
    fastest = row["fastest at the fixed batch"]
    assert fastest.startswith("HYBRID 1 GPU") and "HYBRID 1 GPU vs FSDP NO_SHARD: not distinguishable at this noise" in fastest
    assert report.within_noise(rungs)[0] == ("vit-debug, 1 node(s), batch 4, fp32, pre-lag: "
                                             "HYBRID 1 GPU vs FSDP NO_SHARD: not distinguishable at this noise")
    md = report.render_markdown(rungs, {}, "plots", figures=())
    assert "## Differences within noise" in md and "| [96.00, 112.0] |" in md
    apart = _ci_ladder(tmp_path / "b", (130.0, 125.0, 135.0), (100.0, 95.0, 105.0))
    assert "noise" not in report.winners(apart)[0]["fastest at the fixed batch"] and report.within_noise(apart) == []
    bare = [write_rung(tmp_path / "c", f"vit-debug/{s}/fp32/pre-lag/n1/b4", items_per_s=v) for s, v in (("ddp", 537.3), ("fsdp-full", 439.1))]
    (row,) = report.winners(read_ladder(str(_ladder(tmp_path / "c", bare)))[0])
    assert "DDP vs FSDP FULL_SHARD: no interval to tell them apart" in row["fastest at the fixed batch"]  # 4 measured steps


def test_a_rung_with_repeats_shows_each_run_beside_its_interval(tmp_path: Path) -> None:
    import shutil

    import h5py

    r0 = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", items_per_s=439.1)
    files = [r0]
    for k, v in ((1, 537.3), (2, 480.0)):
        files.append(Path(str(r0).removesuffix(".h5") + f".r{k}.h5"))
        shutil.copy(r0, files[-1])
        with h5py.File(files[-1], "r+") as f:
            f.attrs["items_per_s"] = v
    rungs = read_ladder(str(_ladder(tmp_path, files)))[0]
    fig = fig_throughput_by_model(rungs, Palette(rungs))
    from matplotlib.collections import PathCollection

    (dots,) = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert sorted(dots.get_offsets()[:, 1]) == [439.1, 480.0, 537.3]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "one run (repeats)" in labels and "95% interval (docs/metrics.md)" in labels  # t(2) over the runs
    plt.close("all")


# -- every generation in the figures, labels that can be read ----------------------


def test_fsdp2_and_compiled_rungs_are_in_the_throughput_and_max_batch_figures(tmp_path: Path) -> None:
    from scaleladder.figures.max_batch import fig_max_batch

    specs = {"vit-debug/ddp/fp32/pre-lag/n1/b4": 500.0, "vit-debug/fsdp-full/fp32/pre-lag/n1/b4": 400.0,
             "vit-debug/fsdp-full/fp32/post-nolag/n1/b4": 390.0,  # another FSDP1 knob: not this figure's
             "vit-debug/fsdp2-full/fp32/pf0/n1/b4": 410.0, "vit-debug/fsdp2-full/fp32/pf1/n1/b4": 420.0,
             "vit-debug/fsdp2-full-compile/fp32/pf0/n1/b4": 450.0, "vit-debug/fsdp2-full-ac/fp32/pf0/n1/bmax": 300.0}
    files = [write_rung(tmp_path, s, items_per_s=v, **({"max_batch": 4, "batch": "4"} if s.endswith("bmax") else {}))
             for s, v in specs.items()]
    rungs = read_ladder(str(_ladder(tmp_path, files)))[0]
    fig = fig_throughput_by_model(rungs, Palette(rungs))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"DDP", "FSDP FULL_SHARD", "FSDP2 FULL_SHARD", "FSDP2 FULL_SHARD + compile", "FSDP2 FULL_SHARD + AC"} <= set(legend)
    heights = sorted(round(p.get_height(), 1) for p in fig.axes[0].patches)
    assert heights == [400.0, 410.0, 450.0, 500.0]  # FSDP1 at pre-lag, FSDP2 at pf0: one knob setting per generation
    assert [round(p.get_height()) for p in fig.axes[1].patches] == [300]
    fig = fig_max_batch(rungs, Palette(rungs))
    assert [round(p.get_height()) for p in fig.axes[0].patches] == [4]
    plt.close("all")


@pytest.mark.parametrize("strategies", [
    # the local profile's FSDP rungs at batch 4 (profiles/local/site.yaml): their names must not overlap
    ["fsdp-full", "fsdp-grad-op", "fsdp-full-ac", "fsdp2-full", "fsdp2-full-ac", "fsdp-full-ac-reentrant",
     "fsdp2-full-compile"],
    ["fsdp-no-shard", "fsdp-grad-op", "fsdp-full", "fsdp-hybrid1", "fsdp-hybrid2", "fsdp-full-ac", "fsdp-full-ac-reentrant",
     "fsdp2-grad-op", "fsdp2-full", "fsdp2-full-ac", "fsdp2-hybrid2-ac", "fsdp2-full-ac-compile"],
])
def test_fsdp_knobs_axis_labels_do_not_overlap(tmp_path: Path, strategies: list[str]) -> None:
    from scaleladder.figures.fsdp_knobs import fig_fsdp_knobs

    files = [write_rung(tmp_path, f"vit-debug/{s}/fp32/{k}/n1/b4", items_per_s=100.0 + i)
             for i, s in enumerate(strategies) for k in (("pf0", "pf1") if s.startswith("fsdp2") else ("pre-lag", "post-nolag"))]
    rungs = read_ladder(str(_ladder(tmp_path, files)))[0]
    fig = fig_fsdp_knobs(rungs, Palette(rungs))
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(boxes) == len(strategies)
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 <= b.x0 or not a.overlaps(b), (a, b)
    fig_box = fig.bbox
    assert all(fig_box.x0 <= b.x0 and b.x1 <= fig_box.x1 for b in boxes)  # inside the figure, not cut off
    plt.close("all")


def test_the_pareto_panel_names_a_max_batch_rung_as_one(tmp_path: Path) -> None:
    from scaleladder.figures.pareto import fig_pareto

    files = [write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", items_per_s=350.6, peak_reserved_gib=0.0),
             write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/bmax", items_per_s=564.9, max_batch=4, batch="4",
                        maxbatch_capped=True, peak_reserved_gib=0.0)]
    rungs = read_ladder(str(_ladder(tmp_path, files)))[0]
    texts = _texts(fig_pareto(rungs, Palette(rungs)))
    assert "fastest: DDP, max batch ≥4 (cap)" in texts  # it read "fastest: DDP, batch 4": the fixed batch's words
    plt.close("all")
