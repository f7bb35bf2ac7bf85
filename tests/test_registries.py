"""The extension points' registries kept whole, and the walk through adding to them:
a new figure is one module plus one row of figures/registry.py; a new device, one row of
planner/devices.py. docs/design.md, "Where to change what", lists the files."""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import pytest

from conftest import write_rung
from scaleladder.campaign import cost
from scaleladder.cli import main as cli
from scaleladder.figures import registry
from scaleladder.figures.registry import FigureRow
from scaleladder.planner import devices
from scaleladder.planner.devices import CHIPLESS, DEVICES, GIB, PEAKS, TERA, Memory, Peak, chip_of

REPO = Path(__file__).resolve().parents[1]
CAPTIONS = REPO / "workflow" / "report"

# A name torch.cuda.get_device_name() gives for each chip that rung/device_peak.py's device_key
# knows by its rules (a chip added with a torch_name needs none): every chip is reachable.
TORCH_NAMES = {
    "a100": "NVIDIA A100-SXM4-40GB", "h100": "NVIDIA H100 80GB HBM3", "h100-pcie": "NVIDIA H100 PCIe",
    "h100-nvl": "NVIDIA H100 NVL", "h200": "NVIDIA H200", "h200-nvl": "NVIDIA H200 NVL",
    "mi250x-gcd": "AMD Instinct MI250X", "mi250-gcd": "AMD Instinct MI250",
}


# -- the figure table -----------------------------------------------------------------------


def test_every_figure_row_is_whole() -> None:
    """A name once, a title, a caption file, a draw function that exists, a known drawer."""
    names = registry.names()
    assert len(names) == len(set(names)) and names[:5] == ["throughput_by_model", "max_batch", "fsdp_knobs", "weak_scaling", "pareto"]
    for r in registry.TABLE:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", r.name) and r.title.strip(), r
        assert (CAPTIONS / r.caption).read_text().strip(), r.caption
        assert r.drawn_by in ("plots", "plan", "converge-plots") and r.category in ("Figures", "Planner"), r
        assert callable(registry.draw_function(r.name)), r.draw
        if r.drawn_by == "plots":  # what `scaleladder plots` calls: (rungs, palette) -> Figure
            assert list(inspect.signature(registry.draw_function(r.name)).parameters)[:2] == ["rungs", "palette"], r.draw
    # every caption file is a row's (none left behind by a removed figure)
    assert {p.name for p in CAPTIONS.glob("*.rst")} == {r.caption for r in registry.TABLE}
    with pytest.raises(KeyError, match="no figure 'nope' in figures/registry.py"):
        registry.row("nope")


def test_plots_report_and_snakemake_see_the_same_figures(tmp_path: Path) -> None:
    from scaleladder.figures import plots, report

    parser = __import__("argparse").ArgumentParser()
    plots.add_arguments(parser)
    only = next(a for a in parser._actions if a.dest == "only")
    assert list(only.choices) == registry.names("plots")  # type: ignore[arg-type]
    # the report: the ladder's figures always, the planner's where drawn, never convergence's (its own section)
    assert report.figures_in(str(tmp_path)) == registry.names("plots")
    for name in registry.names():
        (tmp_path / f"{name}.png").write_bytes(b"")
    assert report.figures_in(str(tmp_path)) == [r.name for r in registry.TABLE if r.report]
    # report.smk names no figure itself: its outputs come from the table, captioned as it says
    smk = (REPO / "workflow" / "rules" / "report.smk").read_text()
    code = "\n".join(line.split("#")[0] for line in smk.splitlines())
    assert not [n for n in registry.names() if re.search(rf"\b{n}\.(png|pdf|rst)", code)]
    assert 'figtable.snakemake_outputs("plots")' in smk and 'figtable.snakemake_outputs("plan")' in smk
    assert registry.snakemake_outputs("plan") == [
        ("fits", "results/plots/fits.png", "../report/fits.rst", "Planner"),
        ("predicted_vs_measured", "results/plots/predicted_vs_measured.png", "../report/predicted_vs_measured.rst", "Planner")]
    # the convergence figure's Snakemake entry lives with its rule (converge.smk)
    assert "../report/convergence.rst" in (REPO / "workflow" / "rules" / "converge.smk").read_text()


def test_no_second_list_of_figures_in_src() -> None:
    """The workflow's targets come from the table too: no module but the table lists the figures."""
    listing = re.compile(r'"throughput_by_model",\s*"max_batch"|"fits",\s*"predicted_vs_measured"')
    found = [str(p.relative_to(REPO)) for p in (REPO / "src").rglob("*.py")
             if p.name != "registry.py" and listing.search(p.read_text())]
    assert not found, found


def _fake_figure_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure module of its own, as a new figure would be: one function (rungs, palette) -> Figure."""
    import matplotlib.pyplot as plt

    def fig_fake(rungs: list[dict[str, object]], palette: object) -> object:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.bar([0], [len(rungs)])
        return fig

    module = types.ModuleType("fake_figure")
    module.fig_fake = fig_fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_figure", module)


def test_a_new_figure_is_one_module_and_one_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _fake_figure_module(monkeypatch)
    row = FigureRow("fake", "A fake figure: one module, one row", "fake.rst", "fake_figure:fig_fake", "plots")
    monkeypatch.setattr(registry, "TABLE", (*registry.TABLE, row))  # the one row
    files = [write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b8"), write_rung(tmp_path, "vit-debug/fsdp-full/fp32/pre-lag/n1/b8")]
    ladder, plot_dir = tmp_path / "ladder.h5", tmp_path / "results" / "plots"
    assert cli(["aggregate", "--out", str(ladder), *map(str, files)]) == 0
    assert cli(["plots", "--ladder", str(ladder), "--out-dir", str(plot_dir)]) == 0
    assert "2 rungs -> 12 files" in capsys.readouterr().out  # the five figures and the new one, PNG and PDF
    assert (plot_dir / "fake.png").read_bytes()[:4] == b"\x89PNG" and (plot_dir / "fake.pdf").read_bytes()[:4] == b"%PDF"
    assert cli(["plots", "--ladder", str(ladder), "--out-dir", str(tmp_path / "only"), "--only", "fake"]) == 0
    assert sorted(p.name for p in (tmp_path / "only").iterdir()) == ["fake.pdf", "fake.png"]
    md, html = tmp_path / "results" / "report.md", tmp_path / "results" / "report.html"
    assert cli(["report", "--ladder", str(ladder), "--plots", str(plot_dir), "--md", str(md), "--html", str(html)]) == 0
    assert "## A fake figure: one module, one row\n\n![A fake figure: one module, one row](plots/fake.png)" in md.read_text()
    assert "<h2>A fake figure: one module, one row</h2><img src='plots/fake.png'" in html.read_text()
    # the workflow's targets and Snakemake's report entry (report.smk wraps it in report())
    assert registry.names("plots")[-1] == "fake"
    assert registry.snakemake_outputs("plots")[-1] == ("fake", "results/plots/fake.png", "../report/fake.rst", "Figures")


# -- the figures' words and colours for any strategy ------------------------------------------


def test_a_new_wrapper_gets_a_label_and_a_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper spec.py learns later (here faked where style parses a name) is labelled from
    its name, not a KeyError; the known ones keep their labels (tests/test_plots.py)."""
    from scaleladder.figures import style

    def parse(name: str) -> types.SimpleNamespace:
        wrapper, _, sharding = name.partition("-")
        return types.SimpleNamespace(wrapper=wrapper, sharding=sharding or None, group=None, is_fsdp=False, is_fsdp2=False,
                                     ac=False, compile=False, reentrant=False, selective=False)

    monkeypatch.setattr(style, "parse_strategy", parse)
    assert style.strategy_label("tp") == "TP" and style.strategy_label("zero-stage-3") == "ZERO STAGE_3"
    assert style.strategy_label("ddp") == "DDP" and style.strategy_label("single") == "single process"
    assert style.strategy_sort_key("tp") > style.strategy_sort_key("fsdp-hybrid8")  # after the known ones
    rungs = [{"strategy": s} for s in ("tp", "ddp", "fsdp-full", "zero-stage-3")]
    pal = style.Palette(rungs)  # type: ignore[arg-type]
    assert pal.order == ["ddp", "fsdp-full", "tp", "zero-stage-3"]
    import matplotlib.pyplot as plt

    assert [pal(s) for s in pal.order] == [plt.get_cmap("tab10")(i) for i in range(4)]
    assert pal("not-in-the-ladder") == "grey"


# -- the device table -----------------------------------------------------------------------


def test_every_device_row_is_whole() -> None:
    for chip, p in PEAKS.items():
        assert p.name and p.sms > 0 and 0 < p.fp32 <= p.tf32 <= p.bf16 == p.fp16, chip
        assert p.board_w is None or p.board_w > 0, chip
    memories = [m.key for p in PEAKS.values() for m in p.memories]
    assert len(memories) == len(set(memories)) and not set(memories) & set(CHIPLESS)
    # every planner device but the CPU has a peak through its chip, and the budget finds the same chip
    for device in DEVICES:
        if device in CHIPLESS:
            assert chip_of(device) is None
            continue
        chip = chip_of(device)
        assert chip in PEAKS and cost.peak_key(device) == chip, device
        assert cost.plan_device_peak_flops(device, "bf16-mixed") == PEAKS[chip].bf16
    # the planner's keys, values and order, as `plan --help` and the error messages list them (a new row may add to them)
    known = ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "mi250x-gcd", "cpu"]
    assert [d for d in DEVICES if d in known] == known and list(DEVICES)[-1] == "cpu"
    assert DEVICES["a100-40gb"] == int(39.59 * GIB) and DEVICES["h100-80gb"] == int(79.10 * GIB)
    # the step time reads the same row: its chip's peak and its memory's HBM bandwidth
    for device in DEVICES:
        figures = devices.step_figures(device, "bf16-mixed")
        assert figures is not None and figures[1] > 0, device
        if device not in CHIPLESS:
            assert figures[0] == PEAKS[cost.peak_key(device)].bf16, device


def test_every_chip_is_named_by_the_runner() -> None:
    """rung/device_peak.py's device_key reaches every chip: by its rules, or by the row's torch_name."""
    from scaleladder.rung.device_peak import device_key

    named = {chip: TORCH_NAMES.get(chip) or p.torch_name for chip, p in PEAKS.items()}
    assert all(named.values()), f"a chip no torch name reaches: {[c for c, n in named.items() if not n]}"
    assert {chip: device_key(name) for chip, name in named.items()} == {chip: chip for chip in PEAKS}


def test_a_new_device_is_one_row(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One row: the planner plans on its memory and times a step on its peak and bandwidth, the
    budget prices it at its peak, the runner's MFU finds it by its torch name and SM count."""
    from scaleladder.planner.memory import predict
    from scaleladder.planner.rates import rates
    from scaleladder.rung.device_peak import device_key, peak_for
    from scaleladder.spec import RunSpec

    monkeypatch.setitem(PEAKS, "b300", Peak("NVIDIA B300 (fake)", 75 * TERA, 1100 * TERA, 2250 * TERA, 2250 * TERA, 160, 1100.0,
                                            memories=(Memory("b300-270gb", 268.0, 8000),), torch_name="B300"))
    assert devices.DEVICES["b300-270gb"] == int(268.0 * GIB) and list(DEVICES)[-2:] == ["b300-270gb", "cpu"]
    spec = RunSpec.from_path("vit-3b/fsdp-full/bf16-mixed/pre-lag/n1/bmax")
    big, small = predict(spec, 8, 8, "b300-270gb"), predict(spec, 8, 8, "a100-40gb")
    assert big.capacity_bytes == int(268.0 * GIB) and big.max_batch and small.max_batch and big.max_batch > small.max_batch
    assert cli(["plan", "--spec", "vit-3b/fsdp-full/bf16-mixed/pre-lag/n1/b8", "--device", "b300-270gb"]) == 0
    assert "b300-270gb" in capsys.readouterr().out
    r = rates("b300-270gb", "bf16-mixed")
    assert r.peak_flops == 2250 * TERA and r.hbm_bps == 8000 * 1e9 * 0.8
    assert cost.peak_key("b300-270gb") == "b300" and cost.plan_device_peak_flops("b300-270gb", "bf16-mixed") == 2250 * TERA
    assert device_key("NVIDIA B300 SXM6 AC") == "b300"
    assert peak_for("NVIDIA B300 SXM6 AC", 160, 1100.0, "tf32").flops == 1100 * TERA
    assert "reports 140 SMs" in peak_for("NVIDIA B300 SXM6 AC", 140, 1100.0, "tf32").note  # a slice: no peak
