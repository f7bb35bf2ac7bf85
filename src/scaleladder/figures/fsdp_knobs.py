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
    Palette, knobs_label, note, oom_handles, oom_mark, strategy_label, strategy_sort_key, throughput_label,
)
from scaleladder.results.record import Spec, Throughput


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
    knob_values = sorted({r[Spec.knobs] for r in rs}, key=lambda k: (k.split("-")[0] != "pre", k))
    strategies = sorted({r[Spec.strategy] for r in rs}, key=strategy_sort_key)
    cmap = plt.get_cmap("Set2")
    width = 0.8 / max(1, len(knob_values))
    for j, k in enumerate(knob_values):
        for i, s in enumerate(strategies):
            x = i - 0.4 + width * (j + 0.5)
            match = [r for r in rs if r[Spec.strategy] == s and r[Spec.knobs] == k]
            if not match:
                continue
            r = match[0]
            if is_oom(r):
                oom_mark(ax, x, r)
            elif is_ok(r):
                # hatching tells limit_all_gathers apart even in greyscale print
                ax.bar(x, r[Throughput.items_per_s], width * 0.95, color=cmap(j % 8), edgecolor="black", linewidth=0.4,
                       hatch="" if "-lag" in f"-{k}" and "nolag" not in k else "//", label=None)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=cmap(j % 8), edgecolor="black", hatch="" if "nolag" not in k else "//",
                     label=knobs_label(k)) for j, k in enumerate(knob_values)]
    handles += oom_handles(rs) if any(is_oom(r) for r in rs) else []
    # outside the axes: inside, it covered the tallest (HYBRID) bars
    ax.legend(handles=handles, fontsize=8, title="backward prefetch, all-gathers", title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels([strategy_label(s) for s in strategies], fontsize=9)
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
