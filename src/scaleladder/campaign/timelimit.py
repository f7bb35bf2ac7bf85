"""The time a rung's batch job asks for, and what becomes of a rung predicted past the site's limit.

A job asks for ``margin x predicted + slack`` (``budget.margin``, ``budget.slack_s``), in whole
minutes, where ``predicted`` is the time model's (campaign/cost.py): never one figure per rule.
A rung whose ask is over the site's limit (``site.time_limit_min``) is not submitted as it
stands. It runs fewer steps when its throughput interval still holds at them, else it is refused:

* **fewer steps** -- the most steps whose job still fits, rounded down to a twentieth of the
  configured steps (so that a small change in the prediction does not change the rung's
  command, which would run a finished rung again), the warm-up unchanged;
* **the interval holds** when the measured steps (steps - warm-up) keep the batch-means
  interval (results/stats.py) what it is at the configured steps: at least :data:`MIN_MEASURED`
  of them (10 batches of 10; at 100 steps batch means cover the true mean 91% of the time on
  AR(1) step times with phi = 0.7, tests/test_stats.py and docs/metrics.md "Uncertainty"), or all
  the configured ones where fewer were asked for, and never under ``MIN_STEPS`` (3 batches of 3).
  The line says how much wider the interval is expected to be (:func:`interval_growth`: at a given
  spread of the step times its half-width goes as ``t(b - 1) / sqrt(n)``, ``b = floor(sqrt(n))``);
* otherwise **refused**, in one line naming the rung, its prediction and the limit.

The verdict is taken on the time model WITHOUT finished rungs' calibration, so it does not move
as the campaign runs (the steps are part of the rung's command). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scaleladder.campaign.cost import Estimate
from scaleladder.results.stats import CONFIDENCE, MIN_STEPS, batch_count, t_quantile

__all__ = ["MIN_MEASURED", "STEP_QUANTUM", "Limits", "Verdict", "interval_growth", "judge"]

#: The fewest measured steps a shortened rung keeps (unless fewer were configured): 10 batches of 10.
MIN_MEASURED = 100
#: A shortened rung's steps are a multiple of the configured steps // STEP_QUANTUM.
STEP_QUANTUM = 20


@dataclass(frozen=True)
class Limits:
    """The site's wall-time limit for one job and the margin every job asks for on top of its prediction."""

    limit_s: float
    margin: float = 1.5
    slack_s: float = 300.0

    @property
    def limit_min(self) -> int:
        return int(self.limit_s // 60)

    def ask_s(self, predicted_s: float) -> float:
        return self.margin * predicted_s + self.slack_s

    def fits(self, predicted_s: float) -> bool:
        """Whether a job predicted at ``predicted_s`` can ask for its margin under the limit."""
        return self.ask_s(predicted_s) <= self.limit_s

    def ask_min(self, predicted_s: float) -> int:
        """The job's ``runtime`` in whole minutes: its ask rounded up, at most the limit."""
        return max(1, min(math.ceil(self.ask_s(predicted_s) / 60), self.limit_min))

    @property
    def most_s(self) -> float:
        """The longest prediction that still fits."""
        return (self.limit_s - self.slack_s) / self.margin

    def rule(self) -> str:
        return f"{self.margin:g} x predicted + {self.slack_s:.0f} s under the {self.limit_min} min limit"


def interval_growth(measured: int, configured: int) -> float:
    """The batch-means interval's expected half-width at ``measured`` measured steps over the one at
    ``configured``, at the same spread of step times: ``t(b - 1) / sqrt(n)`` with ``b = floor(sqrt(n))``
    batches (results/stats.py). Infinite below MIN_STEPS: no interval at all."""
    def width(n: int) -> float:
        b = batch_count(n)
        return math.inf if b < 2 else t_quantile(b - 1, CONFIDENCE) / math.sqrt(n)

    return width(measured) / width(configured)


@dataclass(frozen=True)
class Verdict:
    """What a rung's job will be: ``runs`` as configured, ``shortened`` to ``steps``, ``refused``, or
    ``unpriced`` (the time model has nothing to price it with: its job asks for the limit)."""

    path: str
    kind: Literal["runs", "shortened", "refused", "unpriced"]
    steps: int  # the steps it runs
    predicted_s: float  # its job's predicted time at those steps (NaN: unpriced)
    configured_s: float  # at the configured steps
    line: str = ""  # the one line that says why, for shortened and refused rungs


def judge(path: str, est: Estimate, steps: int, warmup: int, limits: Limits) -> Verdict:
    """The verdict on one rung's own job (its start-up, probes and steps: ``est.job_s`` at ``steps``)."""
    if not est.priced or math.isnan(est.step_s) or est.step_s <= 0:
        return Verdict(path, "unpriced", steps, math.nan, math.nan)
    if limits.fits(est.job_s):
        return Verdict(path, "runs", steps, est.job_s, est.job_s)
    fixed = est.job_s - steps * est.step_s  # start-ups, the search's probes, a compile
    room = limits.most_s - fixed
    quantum = max(1, steps // STEP_QUANTUM)
    fit = int(room // est.step_s) // quantum * quantum if room > 0 else 0
    measured, configured = fit - warmup, steps - warmup
    least = max(MIN_STEPS, min(MIN_MEASURED, configured))
    over = f"{path}: predicted {est.job_s / 60:.0f} min at {steps} steps; a job asks {limits.rule()}"
    if measured >= least:
        at = fixed + fit * est.step_s
        return Verdict(path, "shortened", fit, at, est.job_s,
                       f"{over}: runs {fit} steps ({measured} measured of {configured}, its interval about "
                       f"{interval_growth(measured, configured):.2f}x as wide), predicted {at / 60:.0f} min")
    why = (f"the {fit} steps that fit are no more than its {warmup} of warm-up" if fit <= warmup else
           f"the {fit} steps that fit leave {measured} measured, under the {least} its interval needs")
    return Verdict(path, "refused", steps, est.job_s, est.job_s, f"{over}: refused ({why})")
