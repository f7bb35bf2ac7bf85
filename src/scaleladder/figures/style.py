"""How every figure looks and is written: the words on it, one colour per strategy, the
OOM marks, and the atomic save. Labels and colours are derived for any strategy name (a
new wrapper's included), known ones as the seeds' figures name them.

Shared so that the five figures read alike: a strategy keeps its colour and its name in
every figure, and an out-of-memory rung is marked the same way everywhere (a red cross
where measured, a hollow red circle where only predicted).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import matplotlib

# No display on cluster nodes and CI. Every figure module imports this one, so Agg is
# chosen before any figure is drawn (also where pyplot was imported first: `use` then
# switches pyplot, which it may while no figure is open).
matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from scaleladder.figures.rungs import RungAttrs, num
from scaleladder.models.families import built_in
from scaleladder.models.family import Family
from scaleladder.results.record import Build, MaxBatch, Record, Spec
from scaleladder.spec import SpecError, parse_strategy

OOM_COLOR = "#c0392b"


# -- labels -------------------------------------------------------------------------------


def throughput_label(fam: str) -> str:
    # What an item is, the family says (Family.throughput_unit): the FLAVA seed counts items (an
    # image and a text are two), the ViT seed images; any other family, items.
    # Always the GLOBAL rate, summed over every GPU of the run (docs/metrics.md).
    family = built_in(fam)
    what = family.throughput_unit if family is not None else Family.throughput_unit
    return f"global throughput ({what}, all GPUs)"


#: How the figures name a wrapper and an FSDP sharding; a name not here is named by
#: :func:`derived_label` (a new wrapper gets a label, not a KeyError).
WRAPPER_LABELS = {"single": "single process", "ddp": "DDP", "fsdp": "FSDP", "fsdp2": "FSDP2"}
SHARDING_LABELS = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP", "no-shard": "NO_SHARD"}


def derived_label(name: str) -> str:
    """A label for a wrapper or sharding the tables above do not know, from its name alone:
    upper case, dashes as underscores, as torch names its sharding strategies ("zero-3" -> ZERO_3)."""
    return name.replace("-", "_").upper()


def strategy_label(s: str) -> str:
    """A rung's strategy as the seeds' figures name it; FSDP2 rungs say "FSDP2" so a reader
    tells the two generations apart at a glance. A name this version cannot parse
    (an older file's) is shown as it is; a wrapper or sharding the label tables do not know,
    by :func:`derived_label`."""
    try:
        st = parse_strategy(s)
    except SpecError:
        return s
    wrapper = WRAPPER_LABELS.get(st.wrapper) or derived_label(st.wrapper)
    if st.sharding == "hybrid":
        g = st.group
        text = f"{'HSDP' if st.is_fsdp2 else 'HYBRID'} {g} GPU{'s' if g != 1 else ''}"
    elif st.sharding:
        text = f"{wrapper} " + (SHARDING_LABELS.get(st.sharding) or derived_label(st.sharding))
    else:
        text = wrapper
    ac = (" + AC (reentrant)" if st.reentrant else " + SAC" if st.selective else " + AC") if st.ac else ""
    return text + ac + (" + compile" if st.compile else "")


def stacked_label(text: str) -> str:
    """A strategy's name in short lines, for a tick: "FSDP2 FULL_SHARD + AC + compile" becomes
    FSDP2 / FULL_SHARD / + AC / + compile, so that the widest line is one word (SHARD_GRAD_OP)."""
    head, *tail = text.split(" + ")
    if len(head) > 10 and " " in head:
        head = head.replace(" ", "\n", 1)
    return "\n".join([head, *(f"+ {t}" for t in tail)])


#: Inches a tick's slot needs for a :func:`stacked_label` at 9 pt (SHARD_GRAD_OP, with a gap).
LABEL_SLOT_IN = 1.3


def axis_labels(ax: Axes, labels: list[str], fontsize: float = 9) -> None:
    """Strategy names under an axis's ticks in short lines (one line each would overlap); the
    figure must give each :data:`LABEL_SLOT_IN` inches."""
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([stacked_label(t) for t in labels], fontsize=fontsize, linespacing=1.1)


def knobs_label(k: str) -> str:
    base, units = k.partition("-u")[::2]
    if units:  # FSDP2's units of several layers (-u<k>): pf<n> counts units, and the label says how large
        return f"{knobs_label(base).replace(' layers', ' units').replace(' layer', ' unit')}, units of {units} layers"
    if k.startswith("pf"):  # FSDP2: explicit prefetch of the next n units (a unit: a layer, here)
        n = k.removeprefix("pf")
        return "implicit prefetch" if n == "0" else f"prefetch {n} layer{'s' if n != '1' else ''}"
    parts = k.split("-") + ["lag"]
    prefetch = {"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": "no prefetch"}.get(parts[0], parts[0])
    lag = "limit_all_gathers" if parts[1] == "lag" else "no limit_all_gathers"
    return f"{prefetch}, {lag}" + (", forward prefetch" if "fwd" in parts[2:] else "")


def model_label(m: str, rungs: list[RungAttrs]) -> str:
    p = next((num(r.get(Build.params)) for r in rungs if r[Spec.model] == m and num(r.get(Build.params))), None)
    return f"{m}\n({p / 1e6:,.0f}M)" if p and p >= 1e6 else (f"{m}\n({p:,.0f})" if p else m)


def max_batch_label(r: RungAttrs) -> str:
    # a search stopped by its cap (always, on a CPU) found a lower bound, not the max
    mb = r.get(MaxBatch.max_batch, r.get(Spec.batch, "?"))
    return f"≥{mb} (cap)" if r.get(MaxBatch.maxbatch_capped) else f"{mb}"


def held_fixed(rs: list[RungAttrs], keys: tuple[str, ...]) -> str:
    """The values of ``keys`` that all of ``rs`` share, for a title to say what was held fixed."""
    parts = []
    for k in keys:
        vals = sorted({str(r.get(k)) for r in rs})
        if len(vals) == 1:
            v = vals[0]
            if k == Spec.nodes:
                v = f"{v} node{'s' if v != '1' else ''}"
            elif k == Spec.knobs and v.count("-") >= 1:
                v = knobs_label(v)
            parts.append(v)
    return ", ".join(parts)


def note(ax: Axes, text: str) -> None:
    """Say in the panel why it is empty: a partial ladder plots instead of failing."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="dimgrey", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


# -- colours ------------------------------------------------------------------------------


def strategy_sort_key(s: str) -> tuple[int, int, str]:
    """From least to most sharded, the order of every legend and axis; an FSDP2 rung sits
    right after its FSDP1 counterpart, so the two generations stand side by side."""
    base = s.removesuffix("-compile").removesuffix("-ac-reentrant").removesuffix("-sac").removesuffix("-ac").replace("fsdp2-", "fsdp-")
    rank = ["single", "ddp", "fsdp-no-shard", "fsdp-grad-op", "fsdp-full"]
    group = base.removeprefix("fsdp-hybrid")
    if base.startswith("fsdp-hybrid") and (group == "" or group.isdecimal()):  # any other name: after the known
        return (len(rank), int(group or 0), s)
    return (rank.index(base) if base in rank else len(rank) + 1, 0, s)


class Palette:
    """One colour per strategy, the same in every figure.

    Derived for any strategy name, a new wrapper's too: the ladder's strategies in
    :func:`strategy_sort_key` order (a name it does not rank goes after the known ones, by
    name) take tab10's colours in turn (tab20's past ten), so the same ladder always draws
    the same colours. A strategy the ladder does not hold is grey."""

    def __init__(self, rungs: list[RungAttrs]) -> None:
        order = sorted({r[Spec.strategy] for r in rungs}, key=strategy_sort_key)
        cmap = plt.get_cmap("tab10" if len(order) <= 10 else "tab20")
        self.colors = {s: cmap(i % cmap.N) for i, s in enumerate(order)}
        self.order = order

    def __call__(self, strategy: str) -> Any:
        return self.colors.get(strategy, "grey")


# -- out of memory ------------------------------------------------------------------------


def oom_style(r: RungAttrs) -> dict[str, Any]:
    """Measured OOM: a red cross. Predicted (never run): a hollow red circle."""
    if r.get(Record.status) == "predicted-oom":
        return {"marker": "o", "markerfacecolor": "none", "markeredgecolor": OOM_COLOR, "color": OOM_COLOR}
    return {"marker": "x", "color": OOM_COLOR}


def oom_label(r: RungAttrs) -> str:
    return "pred. OOM" if r.get(Record.status) == "predicted-oom" else "OOM"


def oom_mark(ax: Axes, x: float, r: RungAttrs) -> None:
    """A red 'OOM' (or 'pred. OOM') standing on the axis where a bar would be."""
    ax.plot([x], [0], markersize=8, mew=2, clip_on=False, zorder=5, **oom_style(r))
    ax.annotate(
        oom_label(r), (x, 0), xytext=(0, 6), textcoords="offset points", rotation=90, ha="center", va="bottom",
        color=OOM_COLOR, fontsize=7, fontweight="bold",
    )


def oom_handles(rungs: Iterable[RungAttrs]) -> list[Any]:
    """Legend entries for the kinds of OOM this ladder has (a measured one always shows)."""
    from matplotlib.lines import Line2D

    handles: list[Any] = [Line2D([], [], linestyle="", mew=2, label="out of memory (measured)", **oom_style({}))]
    if any(r.get(Record.status) == "predicted-oom" for r in rungs):
        handles.append(Line2D([], [], linestyle="", mew=2, label="predicted not to fit (not run)",
                              **oom_style({Record.status: "predicted-oom"})))
    return handles


# -- writing ------------------------------------------------------------------------------


def save_figure(fig: Figure, path: str) -> str:
    """Write through a temporary file and rename, so an interrupted job never leaves a
    half-written figure that Snakemake would take for a finished one."""
    from scaleladder.files import atomic_file  # a full disk: one line naming the figure, no tmp left

    ext = os.path.splitext(path)[1].lstrip(".")
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format=ext, dpi=150 if ext in ("png", "jpg") else None)
    return path
