"""``fsdp_knobs`` (ViT seed, Figure 1): throughput for FSDP sharding strategy x backward
prefetch x limit_all_gathers, in the one setting (model, nodes, batch, precision) whose
FSDP rungs vary the knobs most."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scaleladder.figures.rungs import RungAttrs, batch_of, family, is_fixed, is_ok, is_oom
from scaleladder.figures.style import (
    LABEL_SLOT_IN,
    Palette,
    axis_labels,
    knobs_label,
    note,
    oom_handles,
    oom_mark,
    strategy_label,
    strategy_sort_key,
    throughput_label,
)
from scaleladder.results.record import Spec, Throughput


def _hatch(knobs: str) -> str:
    return "//" if "nolag" in knobs else ""


def fig_fsdp_knobs(rungs: list[RungAttrs], palette: Palette) -> Figure:
    fig, ax = plt.subplots(figsize=(12, 5))
    fsdp = [r for r in rungs if str(r.get(Spec.strategy, "")).startswith("fsdp") and is_fixed(r)]
    # The setting (model, nodes, batch, precision) whose FSDP rungs vary the knobs most.
    groups: dict[tuple[Any, ...], list[RungAttrs]] = defaultdict(list)
    for r in fsdp:
        groups[(r[Spec.model], int(r.get(Spec.nodes, 1)), batch_of(r), r.get(Spec.precision))].append(r)
    if not groups:
        note(ax, "no FSDP rungs at a fixed batch in this ladder")
        ax.set_title("Throughput by FSDP sharding strategy and communication knobs", fontsize=11)
        return fig
    key = max(groups, key=lambda k: (len({r[Spec.knobs] for r in groups[k]}), len(groups[k]), k[1]))
    rs = groups[key]
    model, nodes, batch, precision = key
    # FSDP1's knobs (BACKWARD_PRE first), then FSDP2's prefetch depths
    knob_values = sorted({r[Spec.knobs] for r in rs}, key=lambda k: (k.startswith("pf"), k.split("-")[0] != "pre", k))
    strategies = sorted({r[Spec.strategy] for r in rs}, key=strategy_sort_key)
    # room under each strategy for its name in short lines, beside the legend (else they overlap)
    fig.set_size_inches(max(12.0, 4.5 + LABEL_SLOT_IN * len(strategies)), 5)
    cmap = plt.get_cmap("Set2")
    # each strategy's bars side by side, centred on its tick: FSDP1 and FSDP2 take different knobs,
    # so a slot per knob value for every strategy would leave gaps
    per = {s: [k for k in knob_values if any(r[Spec.strategy] == s and r[Spec.knobs] == k for r in rs)] for s in strategies}
    width = 0.8 / max(1, max(len(ks) for ks in per.values()))
    for i, s in enumerate(strategies):
        for n, k in enumerate(per[s]):
            j = knob_values.index(k)  # the colour: one per knob value
            x = i + width * (n - (len(per[s]) - 1) / 2)
            r = next(r for r in rs if r[Spec.strategy] == s and r[Spec.knobs] == k)
            if is_oom(r):
                oom_mark(ax, x, r)
            elif is_ok(r):
                # hatching tells limit_all_gathers apart even in greyscale print (FSDP2's pf<k> has no such knob)
                ax.bar(x, r[Throughput.items_per_s], width * 0.95, color=cmap(j % 8), edgecolor="black", linewidth=0.4,
                       hatch=_hatch(k), label=None)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=cmap(j % 8), edgecolor="black", hatch=_hatch(k),
                     label=knobs_label(k)) for j, k in enumerate(knob_values)]
    handles += oom_handles(rs) if any(is_oom(r) for r in rs) else []
    # outside the axes: inside, it covered the tallest (HYBRID) bars
    ax.legend(handles=handles, fontsize=8, title="FSDP: backward prefetch, all-gathers\nFSDP2: explicit prefetch", title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axis_labels(ax, [strategy_label(s) for s in strategies])
    ax.set_ylabel(throughput_label(family(model)))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    unvaried = "" if len(knob_values) > 1 else "  (this ladder varies no knob here)"
    ax.set_title(
        f"{model}, {nodes} node{'s' if nodes != 1 else ''}, local batch {batch}, {precision}: "
        f"throughput by FSDP sharding and knobs{unvaried}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
