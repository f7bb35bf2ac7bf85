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

from scaleladder.flavors import FLAVORS
from scaleladder.results.record import OOM_STATUSES, Build, Interval, Placement, Read, Record, Repeats, Spec, Throughput

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


def on_cpu(r: RungAttrs) -> bool:
    """Ran on the CPU: ``gpus_per_node`` is 0 there (older records without it name a ``cpu (...)`` device)."""
    gpus = num(r.get(Placement.gpus_per_node))
    return gpus == 0 if gpus is not None else str(r.get(Placement.device_name, "")).startswith("cpu")


def memory_measured(r: RungAttrs) -> bool:
    """Whether the rung's allocator peaks mean anything: not on a CPU, whose rungs record 0
    bytes (torch.cuda's allocator statistics are all there is), which is no measurement."""
    return not on_cpu(r)


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


def fixed_batch(rungs: Iterable[RungAttrs]) -> int | None:
    """The fixed local batch a figure or table compares strategies at: 8 when the ladder has
    it (the FLAVA seed's Figure 1), else the smallest it has; None without fixed-batch rungs."""
    batches = sorted({b for r in rungs if (b := batch_of(r)) is not None})
    return 8 if 8 in batches else (batches[0] if batches else None)


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


def is_fsdp2(r: RungAttrs) -> bool:
    return str(r.get(Spec.strategy, "")).startswith("fsdp2")


def at_reference(rungs: list[RungAttrs], keys: tuple[str, ...] = (Spec.precision, Spec.knobs, Spec.nodes)) -> list[RungAttrs]:
    """The rungs at the :func:`reference` values of ``keys``.

    TRAP: the knobs are referenced per FSDP generation. FSDP2 rungs take ``pf0..pf2`` and
    every other rung FSDP1's ``pre-lag``-style knobs, so one knobs value for all would drop
    a whole generation (FSDP2 and its compiled rungs) from the figure."""
    ref = reference(rungs)
    ref[Spec.knobs] = _most_common((r.get(Spec.knobs) for r in rungs if not is_fsdp2(r)), prefer="pre-lag")
    knobs2 = _most_common((r.get(Spec.knobs) for r in rungs if is_fsdp2(r)), prefer="pf0")
    out = []
    for r in rungs:
        want = {k: (knobs2 if k == Spec.knobs and is_fsdp2(r) else ref[k]) for k in keys}
        if all(str(r.get(k)) == str(v) for k, v in want.items()):
            out.append(r)
    return out
