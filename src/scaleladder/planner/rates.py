"""How fast a device computes and how fast its host issues work: the calibration files.

``planner/calibration/<device>.json`` (read with importlib.resources: they ship in the wheel)
holds measured figures for one device under one torch version: per precision, the
achievable matmul rate as ``peak x ceiling x h / (h + h_half)`` (h: the model's width;
small matmuls and the memory-bound ops between them cost relatively more on narrow models,
so the rate rises with width towards the ceiling), and the host's microseconds per aten op.
Where no file measures the device, ``datasheet.json`` gives the datasheet peak and a
STATED efficiency, and every figure says so.

Why one functional form with two numbers: 4(a) of issue 32 asks for every H100 rung
predicted from ONE calibration rung, so each number must come from one measurement; the
ceiling is fixed beforehand (a plain 8192^3 bf16 matmul reaches ~0.80 of the H100's peak),
and vit-base single b128 fixes ``h_half``.

A calibration file for another device or torch version is refused in one line naming both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from scaleladder.errors import SpecError

DATASHEET = "datasheet.json"
BY_DEVICE = {"h100-80gb": "h100.json", "cpu": "cpu.json"}  # committed calibrations; later GPU runs add theirs
OPT_BYTES_PER_PARAM = 28  # fused AdamW reads param, grad, exp_avg, exp_avg_sq (4 x 4 B) and writes 3 x 4 B


def _precision_key(precision: str) -> str:
    if precision in ("bf16-mixed", "bf16-true"):
        return "bf16"
    if precision == "fp16-mixed":
        return "fp16"
    return "tf32" if precision == "tf32" else "fp32"


@dataclass(frozen=True)
class Rates:
    """One device's figures, and where each came from (said beside every prediction)."""

    device: str
    peak_flops: float  # at the precision
    ceiling: float
    h_half: float
    hbm_bps: float  # usable HBM bandwidth (datasheet x stated efficiency)
    us_per_op: float  # host microseconds per top-level aten op, on the reference host
    compute_source: str
    host_source: str
    startup_s: float | None = None
    # the share of what the overlap replay hides that really hides (overlap.py): 1 unless the
    # calibration measured less (a CPU rank with gloo: 0, calibration/cpu*.json)
    overlap: float = 1.0

    def flops_per_s(self, hidden: int) -> float:
        return self.peak_flops * self.ceiling * hidden / (hidden + self.h_half)


def _read(name: str) -> dict[str, Any]:
    return dict(json.loads(resources.files("scaleladder.planner.calibration").joinpath(name).read_text()))


@lru_cache(maxsize=None)
def datasheet() -> dict[str, Any]:
    return _read(DATASHEET)


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
    sheet = datasheet()
    dev = sheet["devices"].get(device)
    if dev is None:
        raise SpecError(f"no datasheet figures for device {device!r} (planner/calibration/{DATASHEET}: "
                        f"{', '.join(sheet['devices'])}); a step time needs a calibration or a datasheet entry")
    cal = calibration
    if cal is None and device in BY_DEVICE:
        cal, where = _read(BY_DEVICE[device]), f"planner/calibration/{BY_DEVICE[device]}"
    eff = sheet["stated_efficiency"]
    peak = float(dev["peak_tflops"][_precision_key(precision)]) * 1e12
    hbm = float(dev["hbm_gbps"]) * 1e9 * float(eff["hbm_efficiency"])
    measured = (cal or {}).get("compute", {}).get(precision)
    if measured:
        ceiling, h_half = float(measured["ceiling"]), float(measured["h_half"])
        csrc = f"measured rate ({where}: {measured.get('from', '')})"
    else:
        ceiling, h_half = float(eff["ceiling"]), float(eff["h_half"])
        csrc = f"datasheet peak x stated efficiency (ceiling {ceiling}, h_half {h_half}; not measured on {device} at {precision})"
    if cal:
        us, hsrc = float(cal["host"]["us_per_op"]), f"measured host ({where}: {cal['host'].get('from', '')})"
    else:
        ref = _read(BY_DEVICE["h100-80gb"])["host"]
        us, hsrc = float(ref["us_per_op"]), f"the H100 host's {ref['us_per_op']} us per op (stated for {device}, not measured)"
    startup = (cal or {}).get("startup_s")
    return Rates(device, peak, ceiling, h_half, hbm, us, csrc, hsrc, None if startup is None else float(startup),
                 overlap=float((cal or {}).get("overlap", 1.0)))
