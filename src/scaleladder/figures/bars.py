"""The grouped bar chart both FLAVA-seed figures draw: models along the axis, one bar per
strategy in its colour, an OOM mark where a bar could not be measured, one legend below."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from scaleladder.figures.rungs import RungAttrs, family, interval, is_oom, repeat_values
from scaleladder.figures.style import Palette, model_label, oom_handles, oom_mark, strategy_label
from scaleladder.results.record import Record, Spec


def families(rungs: list[RungAttrs]) -> list[str]:
    """The model families of the ladder, one row of panels each."""
    return sorted({family(r[Spec.model]) for r in rungs}) or ["other"]


def grouped_bars(
    ax: Axes,
    rs: list[RungAttrs],
    models: list[str],
    strategies: list[str],
    palette: Palette,
    value: Callable[[RungAttrs], float | None],
    annotate: Callable[[RungAttrs], str] | None = None,
    interval: Callable[[RungAttrs], tuple[float, float] | None] | None = None,
) -> None:
    """``interval``: a bar's 95% interval, drawn as an error bar (an unbounded upper end,
    from a step-time interval reaching 0, is drawn to twice the bar)."""
    width = 0.8 / max(1, len(strategies))
    for j, s in enumerate(strategies):
        for i, m in enumerate(models):
            x = i - 0.4 + width * (j + 0.5)
            match = [r for r in rs if r[Spec.model] == m and r[Spec.strategy] == s]
            if not match:
                continue
            r = match[0]
            v = value(r)
            if is_oom(r) or (v is not None and v <= 0 and r.get(Record.status) == "ok"):
                oom_mark(ax, x, r)
            elif v is not None:
                ax.bar(x, v, width * 0.95, color=palette(s), edgecolor="black", linewidth=0.4)
                ci = interval(r) if interval else None
                if ci is not None:
                    lo, hi = ci
                    hi = 2 * v if math.isinf(hi) else hi
                    ax.errorbar(x, v, yerr=[[max(v - lo, 0)], [max(hi - v, 0)]], fmt="none", ecolor="black",
                                elinewidth=0.8, capsize=2)
                reps = repeat_values(r)
                if len(reps) > 1:  # every run of a rung with `repeats`: the spread the bar's mean hides
                    ax.scatter([x] * len(reps), reps, s=10, color="black", marker=".", zorder=4)
                if annotate:
                    ax.annotate(annotate(r), (x, v), xytext=(0, 2), textcoords="offset points", ha="center",
                                va="bottom", fontsize=6)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([model_label(m, rs) for m in models], fontsize=8)
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def strategy_legend(fig: Figure, palette: Palette, strategies: list[str], rungs: list[RungAttrs]) -> None:
    """One legend under the panels: the strategies shown, then the kinds of OOM."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(facecolor=palette(s), edgecolor="black", label=strategy_label(s)) for s in strategies]
    if any(interval(r) for r in rungs):
        handles.append(Line2D([], [], color="black", marker="|", markersize=9, linestyle="none",
                              label="95% interval (docs/metrics.md)"))
    if any(len(repeat_values(r)) > 1 for r in rungs):
        handles.append(Line2D([], [], color="black", marker=".", linestyle="none", label="one run (repeats)"))
    handles += oom_handles(rungs)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
