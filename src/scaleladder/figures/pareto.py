"""``pareto`` (none of the seeds): throughput against peak memory per GPU, one panel per
model, with the Pareto front, i.e. the strategies worth considering for a memory budget."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scaleladder.figures.rungs import RungAttrs, family, is_max, is_ok, is_oom, model_order, num, reference, select
from scaleladder.figures.style import OOM_COLOR, Palette, max_batch_label, note, strategy_label, strategy_sort_key, throughput_label
from scaleladder.results.record import Memory, Read, Record, Spec, Throughput


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, throughput) points no other point beats on both: less memory and more speed."""
    front: list[tuple[float, float]] = []
    for mem, thr in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or thr > front[-1][1]:
            front.append((mem, thr))
    return front


def fig_pareto(rungs: list[RungAttrs], palette: Palette) -> Figure:
    models = model_order(rungs)
    n = max(1, len(models))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows + 1), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    if not models:
        note(axes[0][0], "no rungs in this ladder")
        return fig
    for ax, m in zip(axes.flat, models):
        # One node count per panel (the model's smallest): memory per GPU and throughput
        # are only comparable between rungs on the same number of GPUs.
        rm = [r for r in rungs if r[Spec.model] == m]
        nodes = min(int(r.get(Spec.nodes, 1)) for r in rm)
        rm = select(rm, nodes=nodes, precision=reference(rm)[Spec.precision])
        ok = [r for r in rm if is_ok(r) and num(r.get(Memory.peak_reserved_gib)) is not None]
        for r in ok:
            ax.scatter(r[Memory.peak_reserved_gib], r[Throughput.items_per_s], color=palette(r[Spec.strategy]),
                       marker="^" if is_max(r) else "o", s=40, edgecolor="black", linewidth=0.4, zorder=3)
        front = pareto_front([(r[Memory.peak_reserved_gib], r[Throughput.items_per_s]) for r in ok])
        if front:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", linewidth=1, alpha=0.6,
                    zorder=2)
            best = max(ok, key=lambda r: r[Throughput.items_per_s])
            # a max-batch rung says so: its batch is its search's, not the fixed batch
            batch = f"max batch {max_batch_label(best)}" if is_max(best) else f"batch {best.get(Spec.batch)}"
            ax.text(0.02, 0.97, f"fastest: {strategy_label(best[Spec.strategy])}, {batch}",
                    transform=ax.transAxes, ha="left", va="top", fontsize=7,
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
        if ok and max(r[Memory.peak_reserved_gib] for r in ok) <= 0:
            # a CPU run: torch's CUDA allocator saw nothing, so there is no memory axis
            ax.set_xlim(-0.5, 0.5)
            ax.text(0.98, 0.5, "peak memory is not measured\non a CPU (0 GiB)", transform=ax.transAxes, ha="right",
                    va="center", fontsize=8, color="dimgrey")
        ooms = [r for r in rm if is_oom(r)]
        if ooms:
            ax.text(0.02, 0.02, "OOM: " + ", ".join(sorted({f"{strategy_label(r[Spec.strategy])} b{r.get(Read.spec_batch)}"
                                                             + (" (predicted)" if r.get(Record.status) == "predicted-oom" else "")
                                                             for r in ooms}))[:160],
                    transform=ax.transAxes, fontsize=6, color=OOM_COLOR, va="bottom", wrap=True)
        if not ok and not ooms:
            note(ax, "no measured rungs")
        ax.set_title(f"{m} ({nodes} node{'s' if nodes != 1 else ''})", fontsize=10)
        ax.set_xlabel("peak reserved memory per GPU (GiB)")
        ax.set_ylabel(throughput_label(family(m)))
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    strategies = sorted({r[Spec.strategy] for r in rungs if is_ok(r)}, key=strategy_sort_key)
    handles = [Line2D([], [], color=palette(s), marker="o", linestyle="", label=strategy_label(s)) for s in strategies]
    handles += [
        Line2D([], [], color="grey", marker="o", linestyle="", label="fixed batch"),
        Line2D([], [], color="grey", marker="^", linestyle="", label="max batch"),
        Line2D([], [], color="black", label="Pareto front: nothing is both faster and smaller"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle("Throughput against peak memory per GPU: which strategy for which memory budget", fontsize=12)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return fig
