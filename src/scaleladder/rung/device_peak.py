"""A rank's own device: which chip of the device table it is, and the peak its MFU is
taken against (``planner/devices.py`` holds the table: peaks, SMs, board power, memories).

A device not in the table gets no peak, and MFU is recorded as NaN rather
than guessed (``--peak-tflops`` supplies one by hand).

TRAP: the name alone does not say which part a rank owns. A MIG slice reports its
parent's name with a suffix ("NVIDIA H100 80GB HBM3 MIG 1g.10gb": 16 of 132 SMs),
and a power-capped card reports the plain name; both would be credited the whole
chip's peak, and their MFU would read 8x (a 1g slice) or tens of percent too low. So
a peak is given only when the device's multiprocessor count (CUs on ROCm) equals the
part's, and — where NVML can say — its enforced power limit is within 10% of the
datasheet board power.
:func:`peak_for` makes that decision from plain values, so it is tested on a CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from scaleladder.planner.devices import PEAKS, TERA

# A power limit this far below the datasheet's board power is a capped part: its
# clocks, and so its reachable peak, are lower than the datasheet's.
POWER_TOLERANCE = 0.10


def _norm(name: str) -> str:
    return " ".join(name.upper().split())


def device_key(name: str) -> str | None:
    """Map ``torch.cuda.get_device_name()`` to a PEAKS key (None when unknown or ambiguous).

    TRAP: ROCm's marketing names come from the PCI id, and id 0x740c is named
    "AMD Instinct MI250X / MI250" — either card; a bare "gfx90a" is MI210, MI250 or
    MI250X. Both are ambiguous between peaks 5% apart, so they get no peak: MFU is NaN
    unless ``--peak-tflops`` says which. (Frontier's MI250X, id 0x7408, reports
    "AMD Instinct MI250X".)

    The key names the *part*, not what of it a rank owns: a MIG slice's name maps to
    its parent's key, and :func:`peak_for` refuses it by its SM count.
    """
    n = _norm(name)
    if "MI250" in n:
        x, plain = "MI250X" in n, re.search(r"MI250(?!X)", n) is not None
        return None if x and plain else "mi250x-gcd" if x else "mi250-gcd"
    for chip in ("H200", "H100"):
        if chip in n:  # GH200 (Grace Hopper) carries an H100 SXM-class GPU: the SXM peaks hold
            if "NVL" in n:
                return f"{chip.lower()}-nvl"
            if "PCIE" in n:
                return "h100-pcie" if chip == "H100" else None
            return chip.lower()
    if "A100" in n:
        return "a100"
    # a chip added to the table with the word its torch name carries (planner/devices.py)
    return next((key for key, peak in PEAKS.items() if peak.torch_name and _norm(peak.torch_name) in n), None)


def board_power_w(name: str, key: str) -> float | None:
    """The datasheet's maximum board power of the part ``name`` (None: no check for it).

    One peak row can cover parts with different power: the A100's peaks are the same
    in every form factor, its power is not (SXM4 400 W, PCIe 40GB 250 W, PCIe 80GB
    300 W); a PCIe card measured against 400 W would be refused for no reason.
    GH200 is a superchip with one configurable module budget (CPU, GPU and memory
    together): no per-GPU figure to compare with.
    """
    n = _norm(name)
    if "GH200" in n:
        return None
    if key == "a100" and "PCIE" in n:
        return 250.0 if "40GB" in n else 300.0
    return PEAKS[key].board_w


@dataclass(frozen=True)
class PeakInfo:
    """The peak one rank's device is credited with, and why (or why none)."""

    flops: float  # FLOP/s for the precision; NaN when no peak applies
    note: str  # why there is no peak, or what was not checked; "" when fully checked
    sm_count: int  # multiprocessors (CUs) the device reports; 0 on the CPU
    power_limit_w: float  # enforced power limit; NaN when not read

    def attrs(self) -> dict[str, Any]:
        """Record attributes (HDF5-storable: no None)."""
        return {"device_sm_count": self.sm_count, "device_power_limit_w": self.power_limit_w, "peak_note": self.note}


def peak_for(name: str, sm_count: int, power_limit_w: float | None, precision: str,
             override_tflops: float | None = None, power_unread: str = "NVML unavailable") -> PeakInfo:
    """The peak for a device named ``name`` that reports ``sm_count`` multiprocessors and
    whose enforced power limit is ``power_limit_w`` (None: not read, ``power_unread``
    says why). A pure function: the CPU tests drive it with real names and counts.

    ``--peak-tflops`` (``override_tflops``) wins, and the note keeps what the table
    would have said.
    """
    power = float("nan") if power_limit_w is None else float(power_limit_w)
    flops, note = _table_peak(name, sm_count, power_limit_w, precision, power_unread)
    if override_tflops is not None:
        note = f"peak from --peak-tflops {override_tflops:g}" + (f" (the table: {note})" if note else "")
        return PeakInfo(override_tflops * TERA, note, sm_count, power)
    return PeakInfo(flops, note, sm_count, power)


def _table_peak(name: str, sm_count: int, power_limit_w: float | None, precision: str, power_unread: str) -> tuple[float, str]:
    nan, refuse = float("nan"), "MFU not computed (give --peak-tflops)"
    key = device_key(name)
    if key is None:
        return nan, f"{name} is not in the peak table or is ambiguous; {refuse}"
    peak = PEAKS[key]
    if re.search(r"\bMIG\b", _norm(name)) or sm_count != peak.sms:
        return nan, (f"{name} reports {sm_count} {peak.unit}, the table's {peak.name} has {peak.sms}: "
                     f"a MIG slice or a different part; {refuse}")
    board = board_power_w(name, key)
    if board is None:
        return peak.for_precision(precision), f"power limit not checked (no datasheet board power for {name})"
    if power_limit_w is None:
        return peak.for_precision(precision), f"power limit not checked ({power_unread})"
    if power_limit_w < (1 - POWER_TOLERANCE) * board:
        return nan, (f"{name} is power-capped at {power_limit_w:g} W, the datasheet's {peak.name} peak is at "
                     f"{board:g} W: its clocks cannot reach that peak; {refuse}")
    return peak.for_precision(precision), ""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def nvml_power_limit_w(device: torch.device) -> tuple[float | None, str]:
    """(the enforced power limit of ``device`` in W, or None and why not), from NVML.

    TRAP: NVML numbers GPUs by their place on the node, torch by CUDA_VISIBLE_DEVICES
    (Slurm's --gpus-per-task leaves every rank a "cuda:0"); the PCI bus id is the one
    name both agree on. A MIG slice has its parent's bus id, and the limit is the
    parent's: right, since the whole board is capped.
    """
    if getattr(torch.version, "hip", None):
        return None, "NVML does not see AMD GPUs"
    try:
        import pynvml  # nvidia-ml-py: optional, not a dependency of scaleladder
    except ImportError:
        return None, "pynvml (nvidia-ml-py) not installed"
    try:
        p = torch.cuda.get_device_properties(device)
        # (getattr: torch's type stubs lack the pci_* fields its properties have had since 2.x)
        domain, bus_id, dev_id = (int(getattr(p, k)) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        bus = f"{domain:08X}:{bus_id:02X}:{dev_id:02X}.0"
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, ""  # mW
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # any NVML failure just means "not checked"
        return None, f"NVML: {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def peak_info(device: torch.device, precision: str, override_tflops: float | None = None) -> PeakInfo:
    """Everything about one rank's peak in one call: its FLOP/s, the note, the SM count."""
    if device.type != "cuda":
        if override_tflops is not None:
            return PeakInfo(override_tflops * TERA, f"peak from --peak-tflops {override_tflops:g}", 0, float("nan"))
        return PeakInfo(float("nan"), "no peak for a CPU; MFU not computed", 0, float("nan"))
    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    power, why = nvml_power_limit_w(device)
    return peak_for(device_name(device), sms, power, precision, override_tflops, why)


def rank_device_peak_flops(device: torch.device, precision: str, override_tflops: float | None = None) -> float:
    """Peak FLOP/s for one rank's own device (cf. ``campaign/cost.plan_device_peak_flops``, the
    plan device's table peak before anything runs), or NaN when unknown (CPU included), when the
    device is a slice or a different part than its name says, or when it is power-capped."""
    return peak_info(device, precision, override_tflops).flops
