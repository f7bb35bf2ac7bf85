"""`scaleladder compare BASE NEW`: what changed between two runs of the ladder, with noise.

BASE and NEW are ladder files or folders of rung files. Per rung: the throughput change
NEW/BASE − 1 with a 95% interval from both rungs' standard errors, and a verdict (slower or
faster only when the whole interval is past 0 *and* beyond ``--tolerance``; else same), peak
memory and max batch; exit 1 on a regression, exit 2 when provenance says the rungs measured
different things. ``--reference`` checks NEW against a site's reference values.
Why: docs/metrics.md, "Uncertainty" ("Between two ladders"); docs/workflow.md, "Comparing
two runs of the ladder".
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scaleladder.errors import SpecError
from scaleladder.files import atomic_file
from scaleladder.results import outputs
from scaleladder.results.aggregate import CORRUPT, FORMAT, aggregate, read_ladder
from scaleladder.results.record import (
    OOM_STATUSES,
    Build,
    Corrupt,
    Interval,
    LadderFile,
    Loader,
    MaxBatch,
    Memory,
    Oom,
    Placement,
    Provenance,
    Record,
    Settings,
    Spec,
    Throughput,
)
from scaleladder.results.stats import CONFIDENCE, t_quantile

RungAttrs = dict[str, Any]  # one rung of read_ladder: its record's attributes (results/record.py)
#: What must match for two rungs to measure the same thing: device, world, data.
PROVENANCE = (Placement.device_name, Build.world_size, Placement.ranks_per_node, Settings.data, Loader.tokenizer_vocab_size)
#: What a user changes on purpose between two runs (an upgrade): reported, never refused.
SOFTWARE = (Provenance.torch_version, Provenance.cuda_version, Provenance.hip_version, Provenance.python_version,
            Provenance.container_image, Provenance.git_commit)
#: What a run was measured under beyond the rung itself: a change here moves the numbers with no
#: code changing (steps and warm-up move the measured window, the cap bounds a max batch, shards
#: read through the loader against batches made on the device, FLAVA's implementation, how the
#: loader hands batches over). Said in the verdict, never refused. ``flava_impl`` and
#: ``loader_transport`` are absent from older records: compared only where both rungs hold them.
CONDITIONS = (Settings.steps, Settings.warmup, MaxBatch.maxbatch_cap, Settings.data, "flava_impl", "loader_transport")
OOM = OOM_STATUSES
Z = 1.959964  # two-sided 95% (stats.CONFIDENCE)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="LADDER",
                   help="BASE NEW: two ladder files or folders of rung files; with --reference, NEW alone is enough")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="a throughput change smaller than this fraction is never a verdict (default 0.05)")
    p.add_argument("--memory-tolerance", type=float, default=0.05,
                   help="peak memory may grow by this fraction before it is a regression (default 0.05)")
    p.add_argument("--allow-provenance-change", action="store_true",
                   help="compare rungs whose device, world or data differ (the table says so)")
    p.add_argument("--reference", help="per-site reference values (profiles/<site>/references.yaml) to check NEW against")
    p.add_argument("--figure", default=None, metavar="PNG",
                   help="also draw the change of every rung with its interval, to this PNG (none unless asked)")
    p.add_argument("--table", default=None, metavar="FILE",
                   help=f"every rung's verdict as a table ({', '.join(outputs.FORMATS)}, by the suffix); the console "
                        f"shows the {SHOWN} largest changes and the counts per verdict")


# -- reading ------------------------------------------------------------------------------


def _aggregated(files: list[str]) -> list[RungAttrs]:
    """Rung files read as their ladder would hold them (aggregated into a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        aggregate(files, os.path.join(tmp, "ladder.h5"))
        return read_ladder(os.path.join(tmp, "ladder.h5"))[0]


def load(path: str) -> dict[str, RungAttrs]:
    """The rungs of a ladder file, of one rung file (anywhere: ``scaleladder run ... --out r.h5``;
    its record names its spec) or of a folder of rung files, by spec path."""
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*.h5") if not any(part.startswith(".") for part in f.relative_to(p).parts))
        if not files:
            raise SpecError(f"{path}: folder holds no rung files (*.h5)")
        rungs = _aggregated(files)
    elif p.is_file():
        rungs, root = read_ladder(path)
        if Record.status in root:  # a rung file: its record is the root
            rungs = _aggregated([path])
        elif root.get(LadderFile.format) != FORMAT:
            raise SpecError(f"{path}: neither a ladder file (format {root.get(LadderFile.format)!r}, expected {FORMAT!r}) "
                            "nor a rung file (no 'status'); give `scaleladder aggregate`'s output, a rung file or a folder of them")
    else:
        raise SpecError(f"{path}: no such ladder file, rung file or folder")
    corrupt = [r for r in rungs if r.get(Record.status) == CORRUPT]
    if corrupt:  # a verdict on a rung whose file was unreadable would be a guess
        more = f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else ""
        raise SpecError(f"{corrupt[0].get(Oom.error, corrupt[0][Spec.spec] + ': corrupt')}{more}; redo it with: "
                        f"{corrupt[0].get(Corrupt.redo, '')}")
    return {r[Spec.spec]: r for r in rungs}


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# -- verdicts -----------------------------------------------------------------------------


@dataclass
class Row:
    spec: str
    verdict: str  # faster | slower | same | new | missing | oom-changed
    base: float = math.nan  # items/s
    new: float = math.nan
    change: float = math.nan  # NEW/BASE - 1
    low: float = math.nan  # its 95% interval
    high: float = math.nan
    memory: float = math.nan  # peak reserved NEW/BASE - 1
    max_batch: str = ""
    notes: list[str] = field(default_factory=list)
    regressed: bool = False
    conditions: list[str] = field(default_factory=list)  # "steps 20 -> 50": measured under other conditions

    @property
    def verdict_text(self) -> str:
        """The verdict cell: never REGRESSION without the note when the conditions differ."""
        if not self.conditions:
            return self.verdict + (" (REGRESSION)" if self.regressed else "")
        differ = ", ".join(self.conditions)
        if self.regressed:
            return f"{self.verdict} (REGRESSION under different conditions: {differ})"
        return f"{self.verdict} (conditions differ: {differ})"


def condition_changes(base: RungAttrs, new: RungAttrs) -> list[str]:
    """``steps 20 -> 50`` for each of :data:`CONDITIONS` both rungs state and that differs
    (``data`` as its source: synthetic or shards)."""
    out = []
    for k in CONDITIONS:
        if k in base and k in new:
            b, n = condition_of(base, k), condition_of(new, k)
            if b != n:
                out.append(f"{k} {b} -> {n}")
    return out


def provenance_mismatch(spec: str, base: RungAttrs, new: RungAttrs) -> str:
    """'' when the two rungs measured the same thing, else the first field that differs."""
    for k in PROVENANCE:
        if k in base and k in new and str(base[k]) != str(new[k]):
            return f"rung {spec}: provenance differs in {k}: {base[k]!r} (base) vs {new[k]!r} (new)"
    return ""


def _dof(r: RungAttrs) -> float:
    """The interval's degrees of freedom: ``ci_dof``, else the t its ``ci_method`` names
    ("… t(3) …", records written before 25756b2), else NaN (unknown: read as the normal)."""
    dof = _num(r.get(Interval.ci_dof))
    if dof >= 1:
        return dof
    m = re.search(r"\bt\((\d+)\)", str(r.get(Interval.ci_method, "")))
    return float(m.group(1)) if m and int(m.group(1)) >= 1 else math.nan


def _log_se(r: RungAttrs) -> tuple[float, float]:
    """(standard error of ln items_per_s, its degrees of freedom); NaN where there is no interval."""
    v, se, dof = _num(r.get(Throughput.items_per_s)), _num(r.get(Interval.items_per_s_se)), _dof(r)
    if v > 0 and math.isfinite(se) and se >= 0 and dof >= 1:
        return se / v, dof
    lo, hi = _num(r.get(Interval.items_per_s_ci_low)), _num(r.get(Interval.items_per_s_ci_high))
    if math.isnan(lo) or math.isnan(hi) or v <= 0:
        return math.nan, math.nan
    if lo <= 0:  # an interval reaching 0 bounds nothing on the log scale: the noise swamps the value
        return math.inf, dof
    # An older record: only the interval. Undo ITS t (the normal's z only where it names none).
    # TRAP: recovering ``s`` as ``ln(hi/lo) / 3.92`` overstates the noise by t/1.96 (2.2× at
    # 3 repeats), since the intervals were built with t(b−1) or t(R−1); a record without
    # ``items_per_s_se`` (written before 25756b2) is read through the t its ``ci_method`` names.
    return (math.log(hi) - math.log(lo)) / (2 * (t_quantile(int(dof)) if dof >= 1 else Z)), dof


def throughput_change(base: RungAttrs, new: RungAttrs) -> tuple[float, float, float]:
    """NEW/BASE − 1 and its 95% interval (NaN where either rung has none): the standard
    errors of the two logs combined, with t at the Welch–Satterthwaite degrees of freedom."""
    b, n = _num(base.get(Throughput.items_per_s)), _num(new.get(Throughput.items_per_s))
    if not (b > 0 and n > 0):
        return math.nan, math.nan, math.nan
    d = math.log(n / b)
    (sb, vb), (sn, vn) = _log_se(base), _log_se(new)
    se = math.hypot(sb, sn)
    if math.isnan(se):
        return math.expm1(d), math.nan, math.nan
    if not math.isfinite(se) or se == 0:
        return math.expm1(d), math.expm1(d - se), math.expm1(d + se)  # unbounded, or exact
    if math.isnan(vb) or math.isnan(vn):
        t = Z  # an interval of unknown degrees of freedom: read as the normal's
    else:
        # Welch–Satterthwaite; rounded down, which widens the interval (the safe side)
        dof = (sb**2 + sn**2) ** 2 / (sb**4 / vb + sn**4 / vn)
        t = t_quantile(max(1, int(dof)))
    return math.expm1(d), math.expm1(d - t * se), math.expm1(d + t * se)


def judge(spec: str, base: RungAttrs | None, new: RungAttrs | None, tolerance: float, memory_tolerance: float) -> Row:
    if base is None:
        return Row(spec, "new", new=_num(new.get(Throughput.items_per_s)) if new else math.nan)
    if new is None:
        return Row(spec, "missing", base=_num(base.get(Throughput.items_per_s)))
    sb, sn = str(base.get(Record.status)), str(new.get(Record.status))
    if (sb in OOM) != (sn in OOM):
        row = Row(spec, "oom-changed", base=_num(base.get(Throughput.items_per_s)), new=_num(new.get(Throughput.items_per_s)))
        row.notes.append(f"{sb} -> {sn}")
        row.regressed = sn in OOM
        return row
    if sb in OOM:
        return Row(spec, "same", notes=[f"{sb} in both"])
    row = Row(spec, "same", base=_num(base.get(Throughput.items_per_s)), new=_num(new.get(Throughput.items_per_s)))
    row.change, row.low, row.high = throughput_change(base, new)
    if math.isnan(row.change):
        row.notes.append("no throughput in one of them")
    elif math.isnan(row.low):
        why = "; ".join(dict.fromkeys(n for r in (base, new) if (n := str(r.get(Interval.ci_note, "") or ""))))
        row.notes.append("judged on tolerance alone, noise unknown (no interval" + (f": {why})" if why else ")"))
        if abs(row.change) > tolerance:
            row.verdict = "faster" if row.change > 0 else "slower"
        else:
            row.notes.append("within tolerance")
    elif row.low > 0 and row.change > tolerance:
        row.verdict = "faster"
    elif row.high < 0 and row.change < -tolerance:
        row.verdict = "slower"
    else:
        row.notes.append("within noise" if row.low <= 0 <= row.high else "within tolerance")
    row.regressed = row.verdict == "slower"
    mb, mn = _num(base.get(Memory.peak_reserved_gib)), _num(new.get(Memory.peak_reserved_gib))
    if mb > 0 and mn >= 0:
        row.memory = mn / mb - 1
        if row.memory > memory_tolerance:
            row.regressed = True
            row.notes.append(f"peak memory {row.memory:+.1%}")
    xb, xn = base.get(MaxBatch.max_batch), new.get(MaxBatch.max_batch)
    if xb is not None or xn is not None:
        row.max_batch = f"{xb if xb is not None else '-'} -> {xn if xn is not None else '-'}"
        if _num(xn) < _num(xb):
            row.regressed = True
            row.notes.append("smaller max batch")
    return row


def compare(base: Mapping[str, RungAttrs], new: Mapping[str, RungAttrs], tolerance: float = 0.05,
            memory_tolerance: float = 0.05, allow_provenance_change: bool = False) -> list[Row]:
    """One row per rung in either run, sorted by spec. Raises SpecError naming the first
    provenance difference unless ``allow_provenance_change``."""
    mismatches = [m for s in sorted(set(base) & set(new)) if (m := provenance_mismatch(s, base[s], new[s]))]
    if mismatches and not allow_provenance_change:
        more = f" (and {len(mismatches) - 1} more rung(s))" if len(mismatches) > 1 else ""
        raise SpecError(f"{mismatches[0]}{more}: these rungs measured different things; "
                        "rerun on the same device, world and data, or pass --allow-provenance-change")
    rows = [judge(s, base.get(s), new.get(s), tolerance, memory_tolerance) for s in sorted(set(base) | set(new))]
    for row in rows:
        if row.spec in base and row.spec in new:
            if m := provenance_mismatch(row.spec, base[row.spec], new[row.spec]):
                row.notes.append("provenance changed: " + m.split("provenance differs in ", 1)[1])
            row.conditions = condition_changes(base[row.spec], new[row.spec])
    return rows


def what_changed(base: Mapping[str, RungAttrs], new: Mapping[str, RungAttrs]) -> list[str]:
    """The software the two runs differ in, over the rungs they share: ``torch_version:
    '2.5.1' -> '2.14.1'`` (several values on a side are listed, sorted)."""
    common = sorted(set(base) & set(new))
    lines = []
    for k in SOFTWARE:
        b = sorted({str(base[s][k]) for s in common if k in base[s]})
        n = sorted({str(new[s][k]) for s in common if k in new[s]})
        if b != n:
            lines.append(f"{k}: {', '.join(map(repr, b)) or '-'} -> {', '.join(map(repr, n)) or '-'}")
    return lines


# -- references ---------------------------------------------------------------------------


#: What a reference must state it holds for (``conditions:`` in the file); more keys may be given.
REQUIRED_CONDITIONS = (Placement.device_name, Settings.data)


def condition_of(r: RungAttrs, key: str) -> str:
    """A rung's value of a reference condition: ``data`` is the source (``synthetic`` batches
    made on the device, or ``shards`` read through the loader), anything else its attribute."""
    if key == Settings.data:
        return "synthetic" if str(r.get(Settings.data, "synthetic")) == "synthetic" else "shards"
    return str(r.get(key))


def reference_conditions(path: str, doc: Mapping[str, Any]) -> dict[str, str]:
    """The conditions a reference file holds for; SpecError when it states too few."""
    cond = doc.get("conditions")
    if not isinstance(cond, dict) or any(k not in cond for k in REQUIRED_CONDITIONS):
        raise SpecError(f"{path}: a reference must state the conditions it was measured under, at least "
                        f"'conditions: {{device_name: ..., data: synthetic|shards}}' (a value measured on synthetic "
                        "batches says nothing about a rung that reads shards)")
    if str(cond["data"]) not in ("synthetic", "shards"):
        raise SpecError(f"{path}: conditions.data must be 'synthetic' or 'shards', got {cond['data']!r}")
    return {str(k): str(v) for k, v in cond.items()}


def check_references(path: str, new: Mapping[str, RungAttrs]) -> list[Row]:
    """NEW against a profile's reference values: a row per (rung, metric), regressed when
    the value lies outside ``value × (1 + lower) .. value × (1 + upper)`` or the rung is absent.
    A rung measured under other conditions than the file states (device, data source, ...)
    is refused (SpecError, one line), never judged."""
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read references: {str(e).splitlines()[0]}") from None
    if not isinstance(doc.get("rungs"), dict):
        raise SpecError(f"{path}: expected a mapping 'rungs: {{<spec path>: {{<metric>: [value, lower, upper]}}}}'")
    conditions = reference_conditions(path, doc)
    rows = []
    for spec, metrics in sorted(doc["rungs"].items()):
        for metric, ref in sorted((metrics or {}).items()):
            if not (isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], (int, float))):
                raise SpecError(f"{path}: rungs.{spec}.{metric}: expected [value, lower, upper], got {ref!r}")
            value, lower, upper = float(ref[0]), ref[1], ref[2]
            r = new.get(spec)
            row = Row(spec, "missing", base=value)
            row.notes.append(f"reference {metric}")
            if r is None:
                row.regressed = True
            elif differ := [k for k in conditions if condition_of(r, k) != conditions[k]]:
                k = differ[0]
                raise SpecError(f"{path}: rung {spec} was measured under other conditions than the reference holds for: "
                                f"{k} {condition_of(r, k)!r} (new) vs {conditions[k]!r} (reference); not judged "
                                "(measure a reference under the rung's conditions)")
            else:
                row.new = _num(r.get(metric))
                row.change = row.new / value - 1 if value else math.nan
                below = lower is not None and not row.new >= value * (1 + float(lower))
                above = upper is not None and not row.new <= value * (1 + float(upper))
                row.verdict = "below reference" if below else ("above reference" if above else "within reference")
                row.regressed = below or above
            rows.append(row)
    return rows


# -- output -------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.1%}"


#: rungs the console lists, largest change first (the rest: counted, and in --table)
SHOWN = 20
FIGURE_RUNGS = 40  # rungs the --figure draws


def _interest(r: Row) -> tuple[bool, bool, float]:
    """Sort key: regressions, then any verdict but `same`, each by the size of its change."""
    return (not r.regressed, r.verdict == "same", -abs(r.change) if math.isfinite(r.change) else 0.0)


def counts(rows: Sequence[Row]) -> str:
    """'841 slower (800 REGRESSION), 12 faster, 3 same': every verdict with its count."""
    by: dict[str, int] = {}
    for r in rows:
        by[r.verdict] = by.get(r.verdict, 0) + 1
    regressed = sum(r.regressed for r in rows)
    parts = [f"{n} {v}" for v, n in sorted(by.items(), key=lambda kv: -kv[1])]
    return ", ".join(parts) + (f"; {regressed} REGRESSION" if regressed else "")


def shown(rows: Sequence[Row], limit: int = SHOWN) -> tuple[list[Row], int]:
    """The ``limit`` rows most worth reading (:func:`_interest`), and how many are left out."""
    ordered = sorted(rows, key=_interest)
    return ordered[:limit], max(0, len(rows) - limit)


TABLE_COLUMNS = ("spec", "verdict", "regressed", "base_items_per_s", "new_items_per_s", "change", "ci_low", "ci_high",
                 "memory_change", "max_batch", "conditions", "notes")


def table_rows(rows: Sequence[Row]) -> list[dict[str, outputs.Cell]]:
    """Every verdict as a row of ``--table`` (changes as fractions: NEW/BASE − 1)."""
    def num(x: float) -> float | None:
        return None if math.isnan(x) else x

    return [{"spec": r.spec, "verdict": r.verdict, "regressed": r.regressed, "base_items_per_s": num(r.base),
             "new_items_per_s": num(r.new), "change": num(r.change), "ci_low": num(r.low), "ci_high": num(r.high),
             "memory_change": num(r.memory), "max_batch": r.max_batch, "conditions": "; ".join(r.conditions),
             "notes": "; ".join(r.notes)} for r in rows]


def bounded(rows: Sequence[Row], where: str) -> str:
    """The console's table: the rows most worth reading, and a line for the rest."""
    top, left = shown(rows)
    more = f"\n... and {left} more rung(s): every rung in {where}" if left else ""
    return table(top) + more


def table(rows: Sequence[Row]) -> str:
    head = ("rung", "base items/s", "new items/s", "change", f"{CONFIDENCE:.0%} interval", "verdict", "memory", "max batch", "notes")
    lines = [head]
    for r in rows:
        interval = "-" if math.isnan(r.low) else f"[{_pct(r.low)}, {_pct(r.high)}]"
        lines.append((r.spec, "-" if math.isnan(r.base) else f"{r.base:.1f}", "-" if math.isnan(r.new) else f"{r.new:.1f}",
                      _pct(r.change), interval, r.verdict_text, _pct(r.memory),
                      r.max_batch or "-", "; ".join(r.notes)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


COLORS = {"faster": "#2e86c1", "slower": "#c0392b", "same": "#7f8c8d", "oom-changed": "#8e44ad"}


def figure(rows: Sequence[Row], out: str, tolerance: float, title: str) -> str:
    """Throughput change per rung with its interval, coloured by verdict; ±tolerance shaded. At
    most :data:`FIGURE_RUNGS` rungs, the most worth reading (:func:`shown`): a bar per rung of
    10,000 would be a figure 3,000 inches tall."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes and CI
    import matplotlib.pyplot as plt

    drawn, left = shown([r for r in rows if not math.isnan(r.change)], FIGURE_RUNGS)
    if left:
        title += f" ({len(drawn)} largest changes of {len(drawn) + left})"
    shown_rows = drawn
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * max(1, len(shown_rows))))
    ax.axvspan(-100 * tolerance, 100 * tolerance, color="#eeeeee", zorder=0)
    ax.axvline(0, color="black", linewidth=0.8)
    for i, r in enumerate(shown_rows):
        err = None if math.isnan(r.low) else [[100 * (r.change - r.low)], [100 * min(r.high - r.change, 10.0)]]
        ax.errorbar(100 * r.change, i, xerr=err, fmt="o", color=COLORS.get(r.verdict, "black"), capsize=3)
    ax.set_yticks(range(len(shown_rows)))
    ax.set_yticklabels([r.spec for r in shown_rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"throughput change NEW/BASE − 1 (%), {CONFIDENCE:.0%} interval where known")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Line2D([], [], marker="o", linestyle="", color=c, label=v) for v, c in COLORS.items()]
    handles.append(Patch(facecolor="#eeeeee", label=f"±{tolerance:.0%} tolerance"))
    ax.legend(handles=handles, fontsize=7, loc="best")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", dpi=150)
    plt.close(fig)
    return out


def _report_pair(args: argparse.Namespace, base: dict[str, RungAttrs], new: dict[str, RungAttrs], rows: list[Row]) -> None:
    where = args.table or "--table FILE"
    print(f"scaleladder compare: {args.runs[0]} -> {args.runs[1]} (tolerance {args.tolerance:.0%}): {counts(rows)}")
    for line in what_changed(base, new) or ["no software change recorded (torch, CUDA/HIP, python, image, commit)"]:
        print(f"  changed: {line}")
    print(bounded(rows, where))
    if differ := [r for r in rows if r.conditions]:
        keys = sorted({c.split(" ", 1)[0] for r in differ for c in r.conditions})
        print(f"scaleladder compare: {len(differ)} of {len(rows)} rung(s) were measured under different conditions "
              f"({', '.join(keys)}): a change there may be the conditions', not the code's")
    blind = [r for r in rows if any(n.startswith("judged on tolerance alone") for n in r.notes)]
    if blind:
        print(f"scaleladder compare: {len(blind)} of {len(rows)} rung(s) have no {CONFIDENCE:.0%} interval and were judged "
              f"on the ±{args.tolerance:.0%} tolerance alone (an interval needs at least 9 measured steps: "
              "raise steps - warmup, or run repeats)")
    if args.figure:
        figure(rows, args.figure, args.tolerance, f"{args.runs[0]} → {args.runs[1]}")
        print(f"scaleladder compare: figure -> {args.figure}")


def main(args: argparse.Namespace) -> int:
    if len(args.runs) > 2 or (len(args.runs) == 1 and not args.reference):
        raise SpecError("give BASE and NEW (two ladder files or rung folders), or NEW with --reference")
    if args.table:  # a bad suffix or folder: one line before any reading
        outputs.check(args.table)
    if args.figure:
        outputs.check_folder(args.figure)
    new = load(args.runs[-1])
    rows: list[Row] = []
    if len(args.runs) == 2:
        base = load(args.runs[0])
        rows = compare(base, new, args.tolerance, args.memory_tolerance, args.allow_provenance_change)
        _report_pair(args, base, new, rows)
    if args.reference:
        ref_rows = check_references(args.reference, new)
        print(f"scaleladder compare: {args.runs[-1]} against {args.reference}: {counts(ref_rows)}")
        print(bounded(ref_rows, args.table or "--table FILE"))
        rows += ref_rows
    if args.table:
        outputs.write_table(args.table, TABLE_COLUMNS, table_rows(rows))
        print(f"scaleladder compare: every rung ({len(rows)}) -> {args.table}")
    bad = [r for r in rows if r.regressed]
    if bad:
        conditions = sorted({c.split(" ", 1)[0] for r in bad for c in r.conditions})
        note = (f" ({sum(bool(r.conditions) for r in bad)} of them measured under different conditions: {', '.join(conditions)}; "
                "rerun under the same ones before calling it the code's)") if conditions else ""
        top, left = shown(bad, 10)  # the largest first
        more = f" and {left} more" if left else ""
        print(f"scaleladder compare: {len(bad)} regression(s): {', '.join(r.spec for r in top)}{more}{note}", file=sys.stderr)
        return 1
    return 0
