"""What a rung says, and which rungs a figure takes: the reading every figure shares.

A rung is one row of the aggregated ladder (``results.aggregate.read_ladder``), a plain
dict of its record's attributes (:data:`RungAttrs`), read by the names results/record.py
defines. Here: whether it measured or ran out of memory, its numbers, its model's family and
size order, and the slice of the ladder a figure draws when it holds the dimensions it
does not plot at the seeds' defaults.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from scaleladder.models.flavors import FLAVORS
from scaleladder.results.record import OOM_STATUSES, Build, Interval, Read, Record, Repeats, Spec, Throughput

RungAttrs = dict[str, Any]  # one rung of read_ladder: its record's attributes


def num(v: Any) -> float | None:
    """A number, or None for a metric the rung lacks, one that is not a number, or NaN."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def interval(r: RungAttrs) -> tuple[float, float] | None:
    """A rung's 95% throughput interval (``items_per_s_ci_low/high``, results/stats.py), or
    None where it has none (an OOM, a window too short, a record older than the interval)."""
    lo, hi = num(r.get(Interval.items_per_s_ci_low)), num(r.get(Interval.items_per_s_ci_high))
    return None if lo is None or hi is None else (lo, hi)


def repeat_values(r: RungAttrs) -> list[float]:
    """Each run's throughput of a rung run with ``repeats`` (empty for a single run)."""
    reps = r.get(Repeats.items_per_s_repeats)
    return [x for v in reps if (x := num(v)) is not None] if isinstance(reps, list) else []


def is_ok(r: RungAttrs) -> bool:
    return r.get(Record.status) == "ok" and num(r.get(Throughput.items_per_s)) is not None


def is_oom(r: RungAttrs) -> bool:
    return r.get(Record.status) in OOM_STATUSES


def family(model: str) -> str:
    f = FLAVORS.get(model)
    return f.family if f else "other"


def model_order(rungs: Iterable[RungAttrs]) -> list[str]:
    """Models by size: parameter count where measured, else the registry's order."""
    names = {r[Spec.model] for r in rungs}
    registry = list(FLAVORS)
    params: dict[str, float] = {}
    for r in rungs:
        p = num(r.get(Build.params))
        if p:
            params[r[Spec.model]] = p
    return sorted(names, key=lambda m: (params.get(m, math.inf), registry.index(m) if m in registry else 1e9, m))


def is_fixed(r: RungAttrs) -> bool:
    """Run at a fixed local batch, not a max-batch search."""
    return str(r.get(Read.spec_batch, r.get(Spec.batch))) != "max"


def is_max(r: RungAttrs) -> bool:
    return not is_fixed(r)


def batch_of(r: RungAttrs) -> int | None:
    """The fixed local batch the spec asked for; None for a max-batch rung."""
    b = str(r.get(Read.spec_batch, r.get(Spec.batch)))
    return int(b) if b.isdigit() else None


def select(rungs: list[RungAttrs], **fixed: Any) -> list[RungAttrs]:
    """The rungs whose attributes equal ``fixed``, compared as text so that 8 and "8" match."""
    return [r for r in rungs if all(str(r.get(k)) == str(v) for k, v in fixed.items())]


def _most_common(values: Iterable[Any], prefer: Any = None) -> Any:
    c = Counter(values)
    if not c:
        return None
    if prefer is not None and prefer in c:
        return prefer
    return c.most_common(1)[0][0]


def reference(rungs: list[RungAttrs]) -> dict[str, Any]:
    """The values of the dimensions a figure does not plot: the seeds' own defaults
    (BACKWARD_PRE + limit_all_gathers, the smallest node count) where the ladder has them."""
    return {
        Spec.precision: _most_common((r.get(Spec.precision) for r in rungs), prefer="bf16-mixed"),
        Spec.knobs: _most_common((r.get(Spec.knobs) for r in rungs), prefer="pre-lag"),
        Spec.nodes: min((int(r.get(Spec.nodes, 1)) for r in rungs), default=1),
    }
