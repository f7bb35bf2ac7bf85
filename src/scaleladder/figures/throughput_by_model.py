"""``throughput_by_model`` (FLAVA seed, Figure 1): throughput per model size and strategy,
at a fixed local batch (8 when the ladder has it) and at the max batch, one row per family."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scaleladder.figures.bars import families, grouped_bars, strategy_legend
from scaleladder.figures.rungs import RungAttrs, at_reference, batch_of, family, fixed_batch, interval, is_max, model_order, num
from scaleladder.figures.style import Palette, held_fixed, max_batch_label, note, throughput_label
from scaleladder.results.record import MaxBatch, Spec, Throughput


def fig_throughput_by_model(rungs: list[RungAttrs], palette: Palette) -> Figure:
    fams = families(rungs)
    fig, axes = plt.subplots(len(fams), 2, figsize=(12, 4.2 * len(fams) + 0.8), squeeze=False)
    shown: list[RungAttrs] = []
    for row, fam in enumerate(fams):
        rs_fam = [r for r in rungs if family(r[Spec.model]) == fam]
        rs_fam = at_reference(rs_fam)  # FSDP2 (and compiled) rungs at their own knobs, beside FSDP1's
        b_ref = fixed_batch(rs_fam)
        models = model_order(rs_fam)
        strategies = [s for s in palette.order if any(r[Spec.strategy] == s for r in rs_fam)]
        panels = [
            (f"local batch {b_ref}" if b_ref else "fixed local batch", [r for r in rs_fam if batch_of(r) == b_ref and b_ref]),
            ("max local batch", [r for r in rs_fam if is_max(r)]),
        ]
        for col, (what, rs) in enumerate(panels):
            ax = axes[row][col]
            held = held_fixed(rs or rs_fam, (Spec.precision, Spec.nodes))
            ax.set_title(f"{fam.upper()}: {what}" + (f"  ({held})" if held else ""), fontsize=10)
            if not rs:
                note(ax, f"no {fam} rungs at {what} in this ladder")
                continue
            shown += rs
            grouped_bars(
                ax, rs, models, strategies, palette,
                value=lambda r: num(r.get(Throughput.items_per_s)),
                interval=interval,
                annotate=(lambda r: f"b{'' if r.get(MaxBatch.maxbatch_capped) else '='}{max_batch_label(r)}") if is_max(rs[0]) else None,
            )
            ax.set_ylabel(throughput_label(fam))
    fig.suptitle("Training throughput per model size and strategy", fontsize=12)
    strategy_legend(fig, palette, [s for s in palette.order if any(r[Spec.strategy] == s for r in shown)] or palette.order, shown)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    return fig
