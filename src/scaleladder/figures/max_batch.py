"""``max_batch`` (FLAVA seed, Figure 2): the largest local batch that trains, per strategy
and model size, one row per family."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scaleladder.figures.bars import families, grouped_bars, strategy_legend
from scaleladder.figures.rungs import RungAttrs, at_reference, family, is_max, model_order, num
from scaleladder.figures.style import Palette, held_fixed, max_batch_label, note, strategy_sort_key
from scaleladder.results.record import MaxBatch, Record, Spec


def fig_max_batch(rungs: list[RungAttrs], palette: Palette) -> Figure:
    fams = families(rungs)
    fig, axes = plt.subplots(len(fams), 1, figsize=(9, 4 * len(fams) + 0.8), squeeze=False)
    for row, fam in enumerate(fams):
        ax = axes[row][0]
        rs_fam = [r for r in rungs if family(r[Spec.model]) == fam and is_max(r)]
        rs = at_reference(rs_fam)
        held = held_fixed(rs, (Spec.precision, Spec.nodes))
        ax.set_title(f"{fam.upper()}: largest local batch that trains" + (f"  ({held})" if held else ""), fontsize=10)
        if not rs:
            note(ax, f"no max-batch rungs for {fam} in this ladder")
            continue
        models = model_order(rs)
        strategies = [s for s in palette.order if any(r[Spec.strategy] == s for r in rs)]

        def mb(r: RungAttrs) -> float | None:
            return num(r.get(MaxBatch.max_batch)) if r.get(Record.status) == "ok" else None

        grouped_bars(ax, rs, models, strategies, palette, value=mb, annotate=max_batch_label)
        ax.set_ylabel("max local batch (samples per GPU)")
    fig.suptitle("Max local batch per strategy and model size", fontsize=12)
    maxed = [r for r in rungs if is_max(r)]
    strategy_legend(fig, palette, sorted({r[Spec.strategy] for r in maxed}, key=strategy_sort_key) or palette.order, maxed)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return fig
