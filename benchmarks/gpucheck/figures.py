"""The check's figures: throughput per strategy, throughput by precision, and the planner's
predicted peak against the measured one (drawn by `scaleladder plan --vs-measured`)."""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING, Any

from scaleladder.files import atomic_file

from .config import PRECISION, ROLES
from .rows import pct

if TYPE_CHECKING:
    from .runner import Check


def draw(c: Check) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        c.note("figures", "matplotlib is not importable here: no figures (every number is in the tables)")
        return
    try:
        _throughput(c)
        _precision(c)
    except Exception as e:  # a figure must never cost the tables
        c.note("figures", f"a figure failed: {type(e).__name__}: {e}")
    measured = [r for r in c.rungs if r.status == "ok" and r.file is not None and r.mem("peak_active_gib") > 0]
    if not measured:
        c.note("figures", "no predicted-vs-measured figure: no rung measured device memory "
                          "(the CPU records none)")
        return
    files = list(dict.fromkeys(str(r.file) for r in measured))
    out = c.out / "peak-vs-measured.png"
    cmd = c.sh("plan vs-measured", c.scaleladder("plan", "--vs-measured", str(out), "--gpus-per-node", "1",
                                                 *c.plan_args, "--rungs", *files), 300)
    if cmd.rc == 0 and out.is_file():
        c.figures.append((out.name, "The planner's predicted peak against the measured peak active memory, "
                                    "every rung that ran (`scaleladder plan --vs-measured`); grey: ±10%."))
    else:
        c.note("figures", f"`scaleladder plan --vs-measured` failed (exit {cmd.rc}): {cmd.last_line()}")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on a compute node
    import matplotlib.pyplot as plt

    return plt


def _save(c: Check, fig: Any, name: str, caption: str) -> None:
    with atomic_file(c.out / name) as tmp:
        fig.savefig(tmp, format="png", dpi=130)
    c.figures.append((name, caption))


def _throughput(c: Check) -> None:
    rows = [r for r in c.rungs if r.section == "strategies"]
    roles = [role for role in ROLES if any(r.role == role for r in rows)]
    if not roles:
        return
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(roles), figsize=(5.2 * len(roles), 4.2), squeeze=False)
    for ax, role in zip(axes[0], roles):
        mine = [r for r in rows if r.role == role]
        x = list(range(len(mine)))
        ys = [r.num("items_per_s") if r.status == "ok" else 0.0 for r in mine]
        colors = ["#d58a3a" if r.spec.split("/")[1].endswith("-ac") else "#3a78b5" for r in mine]
        ax.bar(x, [y if math.isfinite(y) else 0.0 for y in ys], color=colors)
        top = max([y for y in ys if math.isfinite(y)] + [1.0])
        for xi, r, y in zip(x, mine, ys):
            label = (pct(r.num("mfu"), 0) if math.isfinite(r.num("mfu")) else "") if r.status == "ok" else r.status
            ax.text(xi, (y if math.isfinite(y) else 0) + 0.01 * top, label, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [r.spec.split("/")[1] for r in mine], rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{role} ({mine[0].spec.split('/')[0]}, b{c.profile.batches[role]})", fontsize=9)
        ax.set_ylabel("items/s")
    fig.suptitle(f"Throughput per strategy, {PRECISION}, one rank: {c.env_info.get('name', '')} "
                 f"(labels: MFU; orange: activation checkpointing)", fontsize=9)
    fig.tight_layout()
    _save(c, fig, "throughput.png", "Throughput per strategy at a fixed batch, one bar per rung, labelled with "
                                    "its MFU (orange bars: activation checkpointing).")
    plt.close(fig)


def _precision(c: Check) -> None:
    rows = [r for r in c.rungs if r.section == "precision"]
    if not rows:
        return
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ys = [r.num("items_per_s") if r.status == "ok" else 0.0 for r in rows]
    ax.bar(range(len(rows)), [y if math.isfinite(y) else 0.0 for y in ys], color="#3a78b5")
    ax.set_xticks(range(len(rows)), [r.spec.split("/")[2] for r in rows])
    ax.set_ylabel("items/s")
    ax.set_title(f"{rows[0].spec.split('/')[0]} single, b{c.profile.batches['vit-base']}, by precision", fontsize=9)
    fig.tight_layout()
    _save(c, fig, "precision.png", "vit-base `single` throughput by precision.")
    plt.close(fig)
