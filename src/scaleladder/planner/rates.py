"""How fast a device computes and how fast its host issues work: the calibration files.

``planner/calibration/<device>.json`` (read with importlib.resources: they ship in the wheel)
holds measured figures for one device under one torch version: per precision, the
achievable matmul rate as ``peak x ceiling x h / (h + h_half)`` (h: the model's width;
small matmuls and the memory-bound ops between them cost relatively more on narrow models,
so the rate rises with width towards the ceiling), and the host's microseconds per aten op.
Where no file measures the device, the device table (``planner/devices.py``) gives the
datasheet peak and HBM bandwidth, this module the STATED efficiency, and every figure says so.

Why one functional form with two numbers: every H100 rung is predicted from ONE calibration
rung (docs/planner.md, "Step time against the H100"), so each number must come from one measurement; the
ceiling is fixed beforehand (a plain 8192^3 bf16 matmul reaches ~0.80 of the H100's peak),
and vit-base single b128 fixes ``h_half``.

A calibration file for another device or torch version is refused in one line naming both.

The host's work per step is measured apart from any device: ``calibration/host_table.json``
(:class:`HostTable`, written by ``benchmarks/host_table.py`` from ``bench_host.py``) holds host ms
per step per flavor x strategy x FLAVA implementation on one CPU; a device's calibration says
how many ms its host takes per ms of the table's (``host.table_factor``), fixed from one
host-bound rung of that device. The per-op figure (``host.us_per_op``) is the stated fallback.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from scaleladder.errors import SpecError
from scaleladder.planner.devices import DEVICES, step_figures

BY_DEVICE = {"h100-80gb": "h100.json", "cpu": "cpu.json"}  # committed calibrations; later GPU runs add theirs
OPT_BYTES_PER_PARAM = 28  # fused AdamW reads param, grad, exp_avg, exp_avg_sq (4 x 4 B) and writes 3 x 4 B

# The STATED efficiency, used where no calibration file measures the device: rate = peak x
# ceiling x h/(h + h_half), h the model's width. Ceiling 0.80: a plain 8192^3 bf16 matmul
# reaches 790-800 of 989 TFLOP/s on an H100 SXM (docs/planner-internals.md, "The step-time model"); h_half
# carried over from the H100 calibration (calibration/h100.json); HBM reaches 0.80 of its
# datasheet bandwidth. NOT measured on the devices they stand in for.
STATED_CEILING = 0.8
STATED_H_HALF = 1394.6
STATED_HBM_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Rates:
    """One device's figures, and where each came from (said beside every prediction)."""

    device: str
    peak_flops: float  # at the precision
    ceiling: float
    h_half: float
    hbm_bps: float  # usable HBM bandwidth (datasheet x stated efficiency)
    us_per_op: float  # host microseconds per top-level aten op, on the reference host (the stated fallback)
    compute_source: str
    host_source: str
    startup_s: float | None = None
    # the calibration host's ms per ms of the host table's (dev-cpu, host_table.py); None: the
    # calibration prices host work per aten op only (the CPU calibrations: docs/planner.md, "Two nodes")
    table_factor: float | None = None
    # the share of what the overlap replay hides that really hides (overlap.py): 1 unless the
    # calibration measured less (a CPU rank with gloo: 0, calibration/cpu*.json)
    overlap: float = 1.0

    def flops_per_s(self, hidden: int) -> float:
        return self.peak_flops * self.ceiling * hidden / (hidden + self.h_half)


def _read(name: str) -> dict[str, Any]:
    return dict(json.loads(resources.files("scaleladder.planner.calibration").joinpath(name).read_text()))


def read_calibration(path: str | Path) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"calibration file {path}: {e}") from e
    for key in ("device", "torch", "compute", "host"):
        if key not in out:
            raise SpecError(f"calibration file {path}: no {key!r}")
    return out


def check_calibration(cal: dict[str, Any], device: str, torch: str | None, where: str) -> None:
    """Refuse a calibration measured on another device or torch (major.minor), naming both."""
    same_torch = torch is None or ".".join(str(torch).split(".")[:2]) == ".".join(str(cal["torch"]).split(".")[:2])
    if cal["device"] != device or not same_torch:
        raise SpecError(f"calibration {where} is for {cal['device']} under torch {cal['torch']}, not "
                        f"{device}" + (f" under torch {torch}" if torch else "") + ": refused")


def rates(device: str, precision: str, calibration: dict[str, Any] | None = None, where: str = "") -> Rates:
    """The device's rates: the calibration's where it measures this precision, else the datasheet's."""
    figures = step_figures(device, precision)
    if figures is None:
        known = [d for d in DEVICES if step_figures(d, precision) is not None]
        raise SpecError(f"no datasheet figures for device {device!r} (planner/devices.py: "
                        f"{', '.join(known)}); a step time needs a calibration or a datasheet entry")
    cal = calibration
    if cal is None and device in BY_DEVICE:
        cal, where = _read(BY_DEVICE[device]), f"planner/calibration/{BY_DEVICE[device]}"
    peak = figures[0]
    hbm = float(figures[1]) * 1e9 * STATED_HBM_EFFICIENCY
    measured = (cal or {}).get("compute", {}).get(precision)
    if measured:
        ceiling, h_half = float(measured["ceiling"]), float(measured["h_half"])
        csrc = f"measured rate ({where}: {measured.get('from', '')})"
    else:
        ceiling, h_half = STATED_CEILING, STATED_H_HALF
        csrc = f"datasheet peak x stated efficiency (ceiling {ceiling}, h_half {h_half}; not measured on {device} at {precision})"
    if cal:
        host = cal["host"]
        hsrc = f"measured host ({where}: {host.get('table_factor_from') or host.get('from', '')})"
    else:  # no calibration host: the H100's, which the sites' stated cpu_factor is relative to
        host = _read(BY_DEVICE["h100-80gb"])["host"]
        hsrc = f"the H100 calibration host's figures (stated for {device}, not measured there)"
    factor = host.get("table_factor")
    startup = (cal or {}).get("startup_s")
    return Rates(device, peak, ceiling, h_half, hbm, float(host["us_per_op"]), csrc, hsrc,
                 None if startup is None else float(startup), None if factor is None else float(factor),
                 float((cal or {}).get("overlap", 1.0)))


# -- the host table: bench_host's measured host work per step (benchmarks/host_table.py) --------

HOST_TABLE = "host_table.json"
WRAPPER_BASES = ("single", "ddp", "fsdp-full", "fsdp2-full")


def split_name(name: str) -> tuple[str, str, bool]:
    """A table strategy name -> (wrapper base, AC suffix '' / '-ac' / '-sac', compiled)."""
    compiled = name.endswith("-compile")
    name = name.removesuffix("-compile")
    for ac in ("-sac", "-ac"):
        if name.endswith(ac):
            return name.removesuffix(ac), ac, compiled
    return name, "", compiled


@dataclass(frozen=True)
class HostTable:
    """Host ms (and aten ops) per step per (model, strategy name, FLAVA implementation), on the
    machine the table names; ``host_ms`` finds a rung's figure or composes it (see there)."""

    rows: dict[tuple[str, str, str], dict[str, Any]]
    where: str
    machine: str

    @classmethod
    def from_json(cls, table: dict[str, Any], where: str) -> HostTable:
        rows = {(r["model"], r["strategy"], r["flava_impl"]): dict(r) for r in table["rows"]}
        return cls(rows, where, str(table.get("machine", "")))

    def _ms(self, model: str, name: str, impl: str) -> float | None:
        row = self.rows.get((model, name, impl))
        return None if row is None else float(row["host_ms"])

    def ratio(self, family: str, name: str, impl: str) -> tuple[float, str] | None:
        """``name``'s host ms over ``single``'s, the median over the family's measured models; a
        name no model measured is composed from its parts (wrapper x AC x compile), each measured;
        None where a part is not."""
        members = family_members(family)
        models = sorted({m for (m, _, i) in self.rows if i == impl and m in members})
        got = [(m, a / b) for m in models if (a := self._ms(m, name, impl)) and (b := self._ms(m, "single", impl))]
        if got:
            r = statistics.median(x for _, x in got)
            return r, f"{name}/single {r:.2f} (median of {', '.join(m for m, _ in got)})"
        base, ac, compiled = split_name(name)
        if compiled and base + ac != "single":
            parts = [base + ac, "single-compile"]
        elif ac and not compiled and base != "single":
            parts = [base, "single" + ac]
        else:  # a part of its own, not measured
            return None
        found = [self.ratio(family, p, impl) for p in parts]
        if any(f is None for f in found):
            return None
        r = math.prod(f[0] for f in found if f)
        return r, " x ".join(f[1] for f in found if f)

    def host_ms(self, model: str, family: str, name: str, impl: str) -> tuple[float, str] | None:
        """The rung's measured row; else the model's ``single`` x the family's ratio for ``name``
        (:meth:`ratio`); None where the table has neither (the caller's stated fallback)."""
        row = self.rows.get((model, name, impl))
        if row is not None:
            return float(row["host_ms"]), f"{model}/{name} measured ({row['host_ms']:.1f} ms, tree {row['tree']})"
        single = self._single(model, family, impl)
        r = self.ratio(family, name, impl) if single is not None and name != "single" else (1.0, "")
        if single is None or r is None:
            return None
        return single[0] * r[0], single[1] + (f" x {r[1]}" if r[1] else "")

    def _single(self, model: str, family: str, impl: str) -> tuple[float, str] | None:
        """``model``'s ``single`` row; else the family's measured model nearest in depth, scaled by
        depth (layers + fusion layers: a step's host work grows with its layer passes)."""
        from scaleladder.flavors import FLAVORS

        row = self.rows.get((model, "single", impl))
        if row is not None:
            return float(row["host_ms"]), f"{model}/single measured ({row['host_ms']:.1f} ms, tree {row['tree']})"
        if model not in FLAVORS:
            return None

        def depth(m: str) -> int:
            return FLAVORS[m].layers + FLAVORS[m].mm_layers

        members = family_members(family)
        refs = [m for (m, n, i) in self.rows if n == "single" and i == impl and m in members and not FLAVORS[m].debug]
        if not refs or FLAVORS[model].debug:
            return None
        ref = min(refs, key=lambda m: (abs(depth(m) - depth(model)), m))
        ms = float(self.rows[(ref, "single", impl)]["host_ms"]) * depth(model) / depth(ref)
        return ms, f"{ref}/single measured x depth {depth(model)}/{depth(ref)} (no row for {model})"


def family_members(family: str) -> set[str]:
    """The registry's models of the family called ``family``, by name."""
    from scaleladder.flavors import FLAVORS

    members: dict[str, set[str]] = {}
    for name, flavor in FLAVORS.items():
        members.setdefault(flavor.family, set()).add(name)
    return members.get(family, set())


@cache
def host_table() -> HostTable:
    """The committed table (``calibration/host_table.json``)."""
    return HostTable.from_json(_read(HOST_TABLE), f"planner/calibration/{HOST_TABLE}")


def read_host_table(path: str | Path) -> HostTable:
    try:
        return HostTable.from_json(json.loads(Path(path).read_text()), str(path))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise SpecError(f"host table {path}: {e}") from e
