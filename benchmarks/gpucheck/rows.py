"""A command the check ran, a rung's row as its record tells it, and how both read in a table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import OOM_RE


@dataclass
class Command:
    """One subprocess this check ran."""

    name: str
    argv: list[str]
    rc: int | None  # None: killed at its time limit
    seconds: float
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def last_line(self) -> str:
        lines = [ln.strip() for ln in self.tail().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


@dataclass
class RungResult:
    """One rung's row: what ran, how it ended, and its record's attributes."""

    section: str
    role: str
    spec: str
    status: str  # ok | oom | predicted-oom | error | timeout
    file: Path | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    seconds: float = 0.0

    def num(self, key: str) -> float:
        """A metric of the record as a float; NaN when absent, empty or not a number (never a crash)."""
        v = self.attrs.get(key)
        try:
            return float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    def mem(self, key: str) -> float:
        """A memory metric; NaN where the rung ran on a CPU (the runner records 0 there: nothing was measured)."""
        if str(self.attrs.get("gpus_per_node", "")) == "0":
            return math.nan
        return self.num(key)


def judge(section: str, role: str, spec: str, cmd: Command, out: Path) -> RungResult:
    """A row from how the command ended: its record when there is one, else why there is none."""
    if out.is_file():
        from scaleladder.results.store import read_attrs

        attrs = read_attrs(out)
        note = str(attrs.get("error", "")) if attrs.get("status") != "ok" else ""
        return RungResult(section, role, spec, str(attrs.get("status", "error")), out, attrs, note[:300], cmd.seconds)
    if cmd.timed_out:
        return RungResult(section, role, spec, "timeout", None, {}, f"killed after {cmd.seconds:.0f} s (see {cmd.log.name})",
                          cmd.seconds)
    tail = cmd.tail()
    # Out of memory outside what the runner can catch and record (the process died of it).
    status = "oom" if OOM_RE.search(tail) else "error"
    return RungResult(section, role, spec, status, None, {}, f"exit {cmd.rc}: {cmd.last_line()} (see {cmd.log.name})", cmd.seconds)


def same_as(rungs: Sequence[RungResult], r: RungResult) -> RungResult | None:
    """The earlier strategies row of ``rungs`` that ran the SAME strategy as ``r`` (None when ``r``
    is the first of its kind): same model, precision, knobs and batch, same AC and compile, and
    the same ``sharding_ran`` read from the wrapped model. On one rank FSDP1's full, grad-op and
    no-shard are all NO_SHARD: such rows are marked, never shown as different
    strategies, and left out of the AC-cost and planner targets."""
    ran = r.attrs.get("sharding_ran")
    if r.section != "strategies" or r.status != "ok" or not ran:
        return None

    def key(x: RungResult) -> tuple[Any, ...]:
        parts = x.spec.split("/")
        strategy = parts[1]
        return (x.role, parts[0], *parts[2:], str(x.attrs.get("sharding_ran")), strategy.endswith("-ac") or "-ac-" in strategy,
                "-compile" in strategy, str(x.attrs.get("wrapper", "")))

    for other in rungs:
        if other is r:
            return None
        if other.section == "strategies" and other.status == "ok" and other.attrs.get("sharding_ran") and key(other) == key(r):
            return other
    return None


def describe(r: RungResult) -> str:
    if r.status != "ok":
        return f"{r.status}{': ' + r.note if r.note else ''}"
    return (f"ok, {fmt(r.num('items_per_s'))} items/s, MFU {pct(r.num('mfu'))}, "
            f"peak active {gib(r.mem('peak_active_gib'))} GiB")


# -- how numbers read ------------------------------------------------------------------------------


def fmt(v: float, digits: int = 1, unit: str = "") -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.{digits}f}{unit}"


def gib(v: float) -> str:
    """GiB with two decimals, or three significant digits below 0.01 GiB (the debug flavors' kilobytes)."""
    if not math.isfinite(v):
        return "n/a"
    return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3g}"


def pct(v: float, digits: int = 1) -> str:
    return "n/a" if not math.isfinite(v) else f"{100 * v:.{digits}f}%"


def seconds_str(s: float) -> str:
    return f"{s:.1f} s" if s < 90 else f"{int(s // 60)} min {s % 60:.0f} s"


def verdict(ok: bool | None, why: str = "") -> str:
    return f"not measured{f' ({why})' if why else ''}" if ok is None else ("met" if ok else "NOT met")


def with_batch(spec: str, batch: Any) -> str:
    return spec.rsplit("/b", 1)[0] + f"/b{batch}"
