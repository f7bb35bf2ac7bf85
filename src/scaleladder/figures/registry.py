"""The one figure table: every figure by name, with its title, its caption, what draws it,
and where it is shown.

``scaleladder plots`` draws the rows that ``plots`` draws, in this order; ``scaleladder
report`` heads each figure with its title; ``workflow/rules/report.smk`` builds its outputs
and Snakemake's report entries (caption, category) from it; the workflow's targets take
their figure names from :func:`names`. So a new ladder figure is one module (a function
``(rungs, palette) -> Figure``) and one row here, plus its caption file.

TRAP: this module is imported while Snakemake builds the DAG (report.smk) and by the
workflow: it names each draw function as ``"module:function"`` and imports nothing heavy.
:func:`draw_function` imports the module when a figure is drawn.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DrawnBy = Literal["plots", "plan", "converge-plots"]


@dataclass(frozen=True)
class FigureRow:
    """One figure."""

    name: str  # results/plots/<name>.png and .pdf; `plots --only` names it so
    title: str  # the report's heading for it
    caption: str  # Snakemake's report caption: workflow/report/<caption>
    draw: str  # "module:function" that draws it
    # the command that draws it: `plots` (from the ladder file, (rungs, palette) -> Figure),
    # `plan` (the planner's charts: --fits-chart, --vs-measured), `converge-plots`
    drawn_by: DrawnBy
    # the report page lists it among its figures: a `plots` figure always, another one
    # when its PNG is in the plots folder (the planner's, on a site with a plan_device)
    report: bool = True
    snakemake_report: bool = True  # Snakemake's report (`snakemake --report`) shows it, captioned
    category: str = "Figures"  # its section in Snakemake's report


# In the order they are drawn and shown. Which seed figure each one redraws, and why:
# docs/workflow.md, "Stages and files" ("Figures").
TABLE: tuple[FigureRow, ...] = (
    FigureRow("throughput_by_model", "Throughput per model size and strategy (fixed batch and max batch)",
              "throughput_by_model.rst", "scaleladder.figures.throughput_by_model:fig_throughput_by_model", "plots"),
    FigureRow("max_batch", "Max local batch per strategy and model size",
              "max_batch.rst", "scaleladder.figures.max_batch:fig_max_batch", "plots"),
    FigureRow("fsdp_knobs", "FSDP sharding strategy x prefetch x limit_all_gathers",
              "fsdp_knobs.rst", "scaleladder.figures.fsdp_knobs:fig_fsdp_knobs", "plots"),
    FigureRow("weak_scaling", "Weak scaling: throughput and memory per GPU against nodes",
              "weak_scaling.rst", "scaleladder.figures.weak_scaling:fig_weak_scaling", "plots"),
    FigureRow("pareto", "Throughput against peak memory: the strategies worth choosing",
              "pareto.rst", "scaleladder.figures.pareto:fig_pareto", "plots"),
    # the planner's figures, on sites that name a device to plan for (shown when present)
    FigureRow("fits", "What fits where: the planner's max local batch per model and strategy",
              "fits.rst", "scaleladder.figures.plan_plots:fits_chart", "plan", category="Planner"),
    FigureRow("predicted_vs_measured", "Planner: predicted against measured peak memory",
              "predicted_vs_measured.rst", "scaleladder.figures.plan_plots:predicted_vs_measured", "plan",
              category="Planner"),
    # the convergence rungs' figure: the report shows it in its own section (--converge),
    # Snakemake's report through workflow/rules/converge.smk
    FigureRow("convergence", "Accuracy kept: time to train", "convergence.rst",
              "scaleladder.figures.convergence:fig_convergence", "converge-plots", report=False),
)


def rows(drawn_by: DrawnBy | None = None) -> list[FigureRow]:
    """The table's rows, in order; only those ``drawn_by`` draws where given."""
    return [r for r in TABLE if drawn_by is None or r.drawn_by == drawn_by]


def names(drawn_by: DrawnBy | None = None) -> list[str]:
    """The figures' names, in order (the workflow's targets: ``names("plots")``, and with a
    plan device ``names("plan")``)."""
    return [r.name for r in rows(drawn_by)]


def row(name: str) -> FigureRow:
    """The row of the figure ``name`` (KeyError naming it and the table's names)."""
    for r in TABLE:
        if r.name == name:
            return r
    raise KeyError(f"no figure {name!r} in figures/registry.py (the table: {', '.join(names())})")


def title(name: str) -> str:
    return row(name).title


def draw_function(name: str) -> Callable[..., Any]:
    """The function that draws ``name``, imported now (matplotlib comes with it)."""
    module, _, function = row(name).draw.partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def snakemake_outputs(drawn_by: DrawnBy) -> list[tuple[str, str, str | None, str]]:
    """(name, PNG path, caption path from workflow/rules/ or None, category) of each figure
    ``drawn_by`` draws: report.smk wraps a PNG with a caption in ``report()``."""
    return [(r.name, f"results/plots/{r.name}.png", f"../report/{r.caption}" if r.snakemake_report else None, r.category)
            for r in rows(drawn_by)]
