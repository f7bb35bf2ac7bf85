"""The planner's two figures: what fits where, and predicted against measured peak memory.

Both take plain data (no HDF5 handles), so the workflow's ``figures/plots.py`` can call them
with whatever it aggregated. matplotlib is imported lazily, with the Agg backend
(compute nodes have no display). The file name's suffix picks the format (PNG, PDF, SVG).

From the command line (what the workflow calls)::

    scaleladder plan --fits-chart fits.pdf --device mi250x-gcd --nodes 1 --gpus-per-node 8 [--batch 32]
    scaleladder plan --vs-measured vs.png --device a100-40gb --ladder results/ladder.h5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.flavors import FLAVORS
from scaleladder.results.record import Build, Memory, Placement, Record, Settings, Spec

if TYPE_CHECKING:
    from scaleladder.campaign.plan_trace import NotTraced

GIB = 2**30


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _model_order(models: list[str]) -> list[str]:
    """Families together, then by parameter count as the seeds publish it (smallest first)."""
    def key(m: str) -> tuple[str, float]:
        f = FLAVORS.get(m)
        return (f.family if f else "", (f.seed_params_m or 0.0) if f else 0.0)

    return sorted(dict.fromkeys(models), key=key)


def fits_chart(cells: list[Any], out: str | Path, title: str = "") -> Path:
    """A model × strategy grid: green = fits (with the max local batch), red = predicted OOM.

    ``cells`` are ``plan.FitsCell`` (anything with model, strategy, fits, max_batch).
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    models = _model_order([c.model for c in cells])
    strategies = list(dict.fromkeys(c.strategy for c in cells))
    by = {(c.model, c.strategy): c for c in cells}
    grid = [[0.0] * len(strategies) for _ in models]
    fig, ax = plt.subplots(figsize=(1.3 * len(strategies) + 2.5, 0.45 * len(models) + 1.8))
    for i, m in enumerate(models):
        for j, s in enumerate(strategies):
            c = by.get((m, s))
            state = 0 if c is None or c.fits is None else (2 if c.fits else 1)
            grid[i][j] = state
            text = {0: "n/a", 1: "OOM", 2: f"{c.max_batch}" if c is not None and c.max_batch else "fits"}[state]
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.imshow(grid, cmap=ListedColormap(["#dddddd", "#f4a6a6", "#a6dba0"]), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right")
    ax.set_yticks(range(len(models)), models)
    ax.set_title(title or "what fits where (predicted)")
    ax.legend(handles=[Patch(color="#a6dba0", label="fits: max local batch"), Patch(color="#f4a6a6", label="predicted OOM"),
                       Patch(color="#dddddd", label="not possible on this world")],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=8, frameon=False)
    return _save(plt, fig, out)


def _save(plt: Any, fig: Any, out: str | Path) -> Path:
    from scaleladder.figures.style import save_figure  # atomic: temporary file, then rename

    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, str(path))
    plt.close(fig)
    return path


@dataclass(frozen=True)
class PeakPoint:
    label: str  # the rung's spec path
    predicted_gib: float
    measured_gib: float


def predicted_vs_measured(points: list[PeakPoint], out: str | Path, title: str = "") -> Path:
    """Scatter of predicted against measured peak active memory, with the y = x line and ±10 %."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.2))
    xs = [p.measured_gib for p in points]
    ys = [p.predicted_gib for p in points]
    hi = max([1.0, *xs, *ys]) * 1.08
    ax.plot([0, hi], [0, hi], color="black", lw=1, label="predicted = measured")
    ax.fill_between([0, hi], [0, 0.9 * hi], [0, 1.1 * hi], color="#cccccc", alpha=0.5, label="±10 %")
    ax.scatter(xs, ys, s=18, zorder=3)
    for p in points:
        if p.measured_gib > 0 and abs(p.predicted_gib / p.measured_gib - 1) > 0.1:
            ax.annotate(p.label, (p.measured_gib, p.predicted_gib), fontsize=6)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured peak active memory per rank (GiB)")
    ax.set_ylabel("predicted peak (GiB)")
    ax.set_title(title or "planner vs measurement")
    ax.legend(fontsize=8, loc="upper left")
    return _save(plt, fig, out)


def _point(a: dict[str, Any], spec_path: str, device: Any,
           missing: list[tuple[NotTraced, int]] | None = None) -> PeakPoint | None:
    """One rung's predicted and measured peak, or None for a rung that measured none.

    Only ``ok`` rungs measured a peak, and a non-GPU rung reports 0. The prediction is
    made for exactly what ran: the batch it settled on (a ``bmax`` rung's ``batch``),
    its world, ranks per node and ``--data``. A models-file model's prediction is its CACHED
    trace's (campaign/plan_trace.py); with none the rung is left out, and (its error, its ranks
    per node) appended to ``missing`` for the caller's one line."""
    from scaleladder.campaign.plan_trace import NotTraced, Untraceable, traced_model
    from scaleladder.flavors import get_flavor
    from scaleladder.planner.memory import predict
    from scaleladder.spec import RunSpec

    measured = float(a.get(Memory.peak_active_gib, 0.0) or 0.0)
    if a.get(Record.status) != "ok" or not measured or math.isnan(measured):
        return None
    spec = RunSpec.from_path(spec_path)
    if spec.strategy.compile:
        return None  # a compiled rung's plan is an upper bound (its eager memory): no verdict to compare
    world = int(a.get(Build.world_size, 1))
    rpn = int(a.get(Placement.ranks_per_node, world))
    batch, data = int(a[Spec.batch]), str(a.get(Settings.data, "synthetic"))
    if traced_model(get_flavor(spec.model)):
        from scaleladder.campaign.plan_trace import predict as predict_traced

        try:
            p = predict_traced(spec, world, rpn, device, batch=batch, data=data, cached_only=True).prediction
        except NotTraced as e:
            if missing is not None:
                missing.append((e, rpn))
            return None
        except Untraceable:
            return None  # FSDP1 on several ranks: no plan to compare
    else:
        p = predict(spec, world, rpn, device, batch=batch, data=data)
    return PeakPoint(spec.path, p.peak_bytes / GIB, measured)


def points_from_rungs(paths: list[str | Path], device: Any, missing: list[tuple[NotTraced, int]] | None = None) -> list[PeakPoint]:
    """Predicted and measured peaks of every ``ok`` rung file."""
    from scaleladder.results.store import read_attrs

    points = []
    for path in paths:
        a = read_attrs(path)
        pt = _point(a, str(a.get(Spec.spec, "")), device, missing)
        if pt is not None:
            points.append(pt)
    return points


def points_from_ladder(path: str | Path, device: Any, missing: list[tuple[NotTraced, int]] | None = None) -> list[PeakPoint]:
    """The same from an aggregated ladder file (``scaleladder aggregate``: one group per rung)."""
    from scaleladder.results.aggregate import read_ladder

    rungs, _root = read_ladder(str(path))
    return [pt for r in rungs if (pt := _point(r, r[Spec.spec], device, missing)) is not None]


def scaling_chart(points: list[Any], out: str | Path, title: str = "", note: str = "") -> Path:
    """The weak-scaling figure before any run (the ViT seed's Figure 2 shape): per model, the
    predicted items/s (top) and memory per GPU (bottom) against nodes, one line per strategy.
    ``points`` are ``plan_time.ScalePoint``; a rung predicted not to fit is left out of both
    panels and marked with an x on the nodes axis of the top one.
    """
    plt = _pyplot()
    models = _model_order([p.model for p in points]) or ["(no rungs)"]
    strategies = list(dict.fromkeys(p.strategy for p in points))
    cmap = plt.get_cmap("tab20")
    color = {s: cmap(i % 20) for i, s in enumerate(strategies)}
    fig, axes = plt.subplots(2, len(models), figsize=(3.4 * len(models) + 1.5, 6.2), squeeze=False, sharex=True)
    for j, m in enumerate(models):
        top, bottom = axes[0][j], axes[1][j]
        for s in strategies:
            pts = sorted((p for p in points if p.model == m and p.strategy == s), key=lambda p: p.nodes)
            ok = [p for p in pts if p.fits and p.items_per_s]
            if ok:
                top.plot([p.nodes for p in ok], [p.items_per_s for p in ok], "o-", ms=3, color=color[s], label=s)
                bottom.plot([p.nodes for p in ok], [p.required_gib for p in ok], "o-", ms=3, color=color[s])
            oom = [p.nodes for p in pts if not p.fits]
            if oom:
                top.plot(oom, [0] * len(oom), "x", color=color[s], ms=6, clip_on=False)
        if not any(p.fits and p.items_per_s for p in points if p.model == m):
            bottom.text(0.5, 0.5, "no strategy predicted to fit", transform=bottom.transAxes,
                        ha="center", va="center", fontsize=8, color="dimgrey")
            top.set_yticks([])  # ticks of an empty axis would read as figures
            bottom.set_yticks([])
        top.set_title(m, fontsize=10)
        top.set_xscale("log", base=2)
        top.set_ylim(bottom=0)
        bottom.set_ylim(bottom=0)
        bottom.set_xlabel("nodes")
        if j == 0:
            top.set_ylabel("predicted items/s (all ranks)")
            bottom.set_ylabel("predicted memory per GPU (GiB, required)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for row in axes[0][1:]:
        h, lab = row.get_legend_handles_labels()
        handles += [x for x, y in zip(h, lab) if y not in labels]
        labels += [y for y in lab if y not in labels]
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=11)
    if note:
        fig.text(0.01, 0.005, f"x on the axis: predicted not to fit. {note}", fontsize=7, color="dimgrey")
    width = fig.get_figwidth()
    fig.tight_layout(rect=(0, 0.02, 1 - 1.6 / width, 0.95))  # 1.6 in for the legend, whatever the panel count
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    from scaleladder.figures.style import save_figure

    save_figure(fig, str(path))
    plt.close(fig)
    return path
