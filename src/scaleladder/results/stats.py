"""How sure a rung's throughput is: the interval of one run (batch means over its window,
:func:`within_run`) and the spread between repeated runs (:func:`between_runs`).

Torch-free (numpy and the standard library), so the rung, the aggregate and ``compare``
share one definition. docs/metrics.md, "Uncertainty", states it and says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

#: Two-sided confidence of every interval scaleladder records.
CONFIDENCE = 0.95
#: Fewest measured steps that give an interval: 3 batches of 3 steps.
MIN_STEPS = 9



def _t_central_mass(t: float, dof: int) -> float:
    """P(|T| < t) for Student's t with an integer ``dof``, exactly (closed form: Abramowitz &
    Stegun 26.7.3-4, finite sums in θ = atan(t/√ν)); no scipy needed (not a dependency)."""
    theta = math.atan(t / math.sqrt(dof))
    sin, cos = math.sin(theta), math.cos(theta)
    c2, term, total = cos * cos, 1.0, 1.0
    if dof % 2:  # ν odd: (2/π)[θ + sinθ cosθ (1 + 2/3 cos²θ + … + (2·4…(ν−3))/(3·5…(ν−2)) cos^(ν−3)θ)]
        if dof == 1:
            return 2 * theta / math.pi
        for k in range(1, (dof - 3) // 2 + 1):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + sin * cos * total)
    for k in range(1, (dof - 2) // 2 + 1):  # ν even: sinθ (1 + 1/2 cos²θ + … + (1·3…(ν−3))/(2·4…(ν−2)) cos^(ν−2)θ)
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return sin * total


@lru_cache(maxsize=1024)
def t_quantile(dof: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``dof`` degrees of freedom
    (``t(dof)`` at 0.975 for 95%), exact to ~1e-12 by bisection on the closed-form CDF.

    TRAP: the normal's 1.96 is NOT close enough above 30 degrees of freedom: t(31) = 2.040,
    4% wider; t(60) = 2.000 still 2% wider (an earlier table used 1.96 from 31 on)."""
    if dof < 1:
        raise ValueError(f"t quantile needs at least 1 degree of freedom, got {dof}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    lo, hi = 0.0, 1.0
    while _t_central_mass(hi, dof) < confidence:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_central_mass(mid, dof) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2


def t975(dof: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%) for ``dof`` degrees of freedom, exact."""
    return t_quantile(dof, 0.95)


def batch_means(x: Sequence[float] | np.ndarray) -> tuple[float, float, str, str]:
    """The mean of ``x`` and its 95% interval's half-width by batch means, the method in
    words, and why there is no interval ('' when there is one; the half-width is then NaN)."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n == 0:
        return math.nan, math.nan, "", "no measured steps"
    mean = float(a.mean())
    if not np.all(np.isfinite(a)):
        return mean, math.nan, "", "a measured step time is not finite"
    if n < MIN_STEPS:
        return mean, math.nan, "", f"{n} measured steps: an interval needs at least {MIN_STEPS} (3 batches of 3)"
    b = math.isqrt(n)
    m = n // b
    batches = a[n - b * m:].reshape(b, m).mean(axis=1)  # drop the oldest leftover steps
    half = t_quantile(b - 1) * float(batches.std(ddof=1)) / math.sqrt(b)
    return mean, half, f"batch means: {b} batches of {m} steps, t({b - 1}), {CONFIDENCE:.0%}", ""


def batch_count(n: int) -> int:
    """The number of batches :func:`batch_means` cuts ``n`` measured steps into (its interval has
    one fewer degrees of freedom); 0 below :data:`MIN_STEPS`."""
    return math.isqrt(n) if n >= MIN_STEPS else 0


def within_run(step_time_s: Sequence[float] | np.ndarray, warmup: int, items_per_s: float) -> dict[str, Any]:
    """The record attributes of one run's uncertainty (docs/metrics.md):
    ``items_per_s_median`` (throughput at the median step), ``items_per_s_ci_low`` /
    ``_high`` (95% interval of ``items_per_s``), ``ci_method``, ``ci_note`` (why the
    interval is NaN; '' otherwise), ``ci_level`` and ``ci_steps`` (steps it rests on), and
    what the interval was built from: ``items_per_s_se`` (the standard error of
    ``items_per_s``, the step-time mean's relative standard error times the throughput: the
    delta method, so ``items_per_s_se / items_per_s`` is the standard error of its log) and
    ``ci_dof`` (the t's degrees of freedom; 0 where there is no interval). ``compare`` uses
    these two, never the interval's width divided by some z."""
    measured = np.asarray(step_time_s, dtype=float)[int(warmup):]
    mean, half, method, note = batch_means(measured)
    attrs: dict[str, Any] = {"ci_level": CONFIDENCE, "ci_steps": int(measured.size), "ci_method": method, "ci_note": note,
                             "items_per_s_se": math.nan, "ci_dof": 0}
    ok = measured.size > 0 and math.isfinite(mean) and mean > 0 and math.isfinite(items_per_s)
    median = float(np.median(measured)) if measured.size else math.nan
    attrs["items_per_s_median"] = items_per_s * mean / median if ok and median > 0 else math.nan
    if ok and math.isfinite(half):
        dof = batch_count(int(measured.size)) - 1
        attrs["ci_dof"] = dof
        attrs["items_per_s_se"] = items_per_s * (half / t_quantile(dof)) / mean
        lo, hi = mean - half, mean + half
        attrs["items_per_s_ci_low"] = items_per_s * mean / hi
        # A lower step-time bound at or below 0 bounds the throughput from below only.
        attrs["items_per_s_ci_high"] = items_per_s * mean / lo if lo > 0 else math.inf
    else:
        attrs["items_per_s_ci_low"] = attrs["items_per_s_ci_high"] = math.nan
    return attrs


def between_runs(values: Sequence[float], within: Sequence[tuple[float, float, float]] = ()) -> dict[str, Any]:
    """The summary of R ≥ 2 repeats' throughputs ``values``: the headline ``items_per_s``
    (their mean), its t interval, ``items_per_s_repeats``, ``between_run_cv`` (sd/mean), and
    ``within_run_rel_halfwidth``: the median over repeats of each run's own interval
    half-width relative to its value (``within``: (value, ci_low, ci_high) per repeat; NaN
    where no repeat has an interval)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    r = int(x.size)
    attrs: dict[str, Any] = {"repeats": len(values), "items_per_s_repeats": [float(v) for v in values], "ci_level": CONFIDENCE}
    if r < 2:
        raise ValueError(f"between-run spread needs at least 2 measured repeats, got {r}")
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    half = t_quantile(r - 1) * sd / math.sqrt(r)
    attrs.update({
        "items_per_s": mean,
        # a throughput is never below 0: with few, scattered repeats t·sd/√R can exceed the
        # mean, and the interval then bounds the rung from above only
        "items_per_s_ci_low": max(mean - half, 0.0),
        "items_per_s_ci_high": mean + half,
        "items_per_s_median": float(np.median(x)),
        "ci_method": f"between runs: t({r - 1}) over {r} repeats, {CONFIDENCE:.0%}",
        "ci_note": "",
        # what the interval was built from, for compare: standard error and t's degrees of freedom
        "items_per_s_se": sd / math.sqrt(r),
        "ci_dof": r - 1,
        "between_run_cv": sd / mean if mean > 0 else math.nan,
    })
    rel = [(hi - lo) / 2 / v for v, lo, hi in within if v > 0 and math.isfinite(lo) and math.isfinite(hi)]
    attrs["within_run_rel_halfwidth"] = float(np.median(rel)) if rel else math.nan
    return attrs


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool | None:
    """Whether two intervals overlap; None when either is unknown (NaN), so a caller
    cannot mistake 'no interval' for 'distinct'."""
    if any(math.isnan(v) for v in (*a, *b)):
        return None
    return a[0] <= b[1] and b[0] <= a[1]
