"""``weak_scaling`` (ViT seed, Figures 2-3): throughput against nodes with the ideal linear
line from each strategy's first point, and peak memory per GPU against nodes, one row per
model, at the fixed local batch the ladder runs on the most node counts."""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from scaleladder.figures.rungs import RungAttrs, at_reference, batch_of, family, interval, is_fixed, is_ok, is_oom, model_order, num
from scaleladder.figures.style import Palette, held_fixed, note, oom_handles, oom_style, strategy_label, throughput_label
from scaleladder.results.record import Memory, Spec, Throughput


def fig_weak_scaling(rungs: list[RungAttrs], palette: Palette) -> Figure:
    fixed = [r for r in rungs if is_fixed(r)]
    # The batch the scaling study uses: the fixed batch with the most node counts.
    by_batch: dict[int | None, set[int]] = defaultdict(set)
    for r in fixed:
        by_batch[batch_of(r)].add(int(r.get(Spec.nodes, 1)))
    batch = max(by_batch, key=lambda b: (len(by_batch[b]), b or 0)) if by_batch else None
    rs = [r for r in at_reference(fixed, (Spec.precision, Spec.knobs)) if batch_of(r) == batch]
    models = model_order(rs)
    fig, axes = plt.subplots(max(1, len(models)), 2, figsize=(12, 3.4 * max(1, len(models)) + 1), squeeze=False)
    if not rs:
        note(axes[0][0], "no fixed-batch rungs in this ladder")
        note(axes[0][1], "")
        return fig
    node_counts = sorted({int(r[Spec.nodes]) for r in rs})
    for row, m in enumerate(models):
        ax_t, ax_m = axes[row]
        rm = [r for r in rs if r[Spec.model] == m]
        for s in [s for s in palette.order if any(r[Spec.strategy] == s for r in rm)]:
            pts = sorted((int(r[Spec.nodes]), r) for r in rm if r[Spec.strategy] == s)
            ok = [(n, r) for n, r in pts if is_ok(r)]
            if ok:
                xs = [n for n, _ in ok]
                ax_t.plot(xs, [r[Throughput.items_per_s] for _, r in ok], marker="o", color=palette(s), label=strategy_label(s))
                # the 95% band; a node count without an interval leaves a gap, not a guess
                band = [interval(r) or (float("nan"), float("nan")) for _, r in ok]
                if any(b[0] == b[0] for b in band):
                    hi = [min(b[1], 2 * r[Throughput.items_per_s]) for b, (_, r) in zip(band, ok)]
                    ax_t.fill_between(xs, [b[0] for b in band], hi, color=palette(s), alpha=0.2, linewidth=0)
                    ax_t.errorbar(xs, [r[Throughput.items_per_s] for _, r in ok],
                                  yerr=[[r[Throughput.items_per_s] - b[0] for b, (_, r) in zip(band, ok)],
                                        [h - r[Throughput.items_per_s] for h, (_, r) in zip(hi, ok)]],
                                  fmt="none", ecolor=palette(s), elinewidth=0.8, capsize=2)
                n0, r0 = ok[0]
                ideal = [r0[Throughput.items_per_s] * n / n0 for n in node_counts if n >= n0]
                ax_t.plot([n for n in node_counts if n >= n0], ideal, linestyle="--", color=palette(s), alpha=0.6,
                          linewidth=1)
                mem = [(n, num(r.get(Memory.peak_reserved_gib))) for n, r in ok if num(r.get(Memory.peak_reserved_gib)) is not None]
                if mem:
                    ax_m.plot([n for n, _ in mem], [v for _, v in mem], marker="s", color=palette(s), label=strategy_label(s))
            for n, r in pts:
                if is_oom(r):
                    for ax in (ax_t, ax_m):
                        ax.plot([n], [0], markersize=9, mew=2, clip_on=False, zorder=5, **oom_style(r))
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.set_xticks(node_counts)
            ax.set_xticklabels([str(n) for n in node_counts])
            ax.set_xlabel("nodes")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        ax_t.set_ylabel(throughput_label(family(m)))
        ax_m.set_ylabel("peak reserved memory per GPU (GiB)")
        ax_t.set_title(f"{m}: weak scaling at local batch {batch} (dashed: ideal linear)", fontsize=10)
        ax_m.set_title(f"{m}: memory per GPU", fontsize=10)
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    from matplotlib.lines import Line2D

    handles += [Line2D([], [], color="black", linestyle="--", label="ideal linear scaling"), *oom_handles(rs)]
    if any(interval(r) for r in rs):
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="black", alpha=0.2, label="95% interval (docs/metrics.md)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    held = held_fixed(rs, (Spec.precision, Spec.knobs))
    fig.suptitle("Weak scaling: throughput and memory per GPU against nodes" + (f" ({held})" if held else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig
