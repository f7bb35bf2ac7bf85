"""`scaleladder plots`: the figures, drawn from an aggregated ladder file.

The command: it draws the rows of the figure table (``registry``) that ``plots`` draws, each
its own module (``throughput_by_model``, ``max_batch``, ``fsdp_knobs``, ``weak_scaling``,
``pareto``), each as PNG and PDF; what they share is in ``rungs`` (what a rung says) and
``style`` (labels, colours, OOM marks, the atomic save). ``convergence`` is drawn from
convergence records by ``scaleladder converge-plots``. An OOM is drawn as a result, a
predicted OOM never as a measurement, and an absent rung is simply absent. Which seed figure
each one redraws, and why: docs/workflow.md, "Stages and files" ("Figures").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable

import matplotlib.pyplot as plt

from scaleladder.figures import registry
from scaleladder.figures.rungs import RungAttrs
from scaleladder.figures.style import Palette, save_figure
from scaleladder.results.aggregate import read_ladder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ladder", required=True, help="the aggregated HDF5 (results/ladder.h5)")
    parser.add_argument("--out-dir", required=True, help="folder for <figure>.png and <figure>.pdf")
    parser.add_argument("--only", nargs="*", choices=registry.names("plots"), help="draw only these figures")


def draw_all(rungs: list[RungAttrs], out_dir: str, only: Iterable[str] | None = None) -> list[str]:
    """Write every figure as PNG and PDF; return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    palette = Palette(rungs)
    written = []
    for name in only or registry.names("plots"):
        fig = registry.draw_function(name)(rungs, palette)
        for ext in ("png", "pdf"):
            written.append(save_figure(fig, os.path.join(out_dir, f"{name}.{ext}")))
        plt.close(fig)
    return written


def main(args: argparse.Namespace) -> int:
    if not os.path.exists(args.ladder):
        print(f"scaleladder plots: error: no ladder file {args.ladder}", file=sys.stderr)
        return 2
    rungs, _root = read_ladder(args.ladder)
    written = draw_all(rungs, args.out_dir, args.only)
    print(f"scaleladder plots: {len(rungs)} rungs -> {len(written)} files in {args.out_dir}")
    return 0
