"""Peak dense FLOP/s per device and precision: the MFU denominator.

Numbers are vendor datasheet peaks for dense (non-sparse) math, per *device a
rank owns*. The trap (torchtitan #920/#928): an MI250X card is two GCDs and
each GCD is one rank, so its peak is the card's 383 TF/s bf16 halved, 191.5.
MI250X has no TF32 mode; ``tf32`` there runs fp32 matrix math.

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

TERA = 1e12

# A power limit this far below the datasheet's board power is a capped part: its
# clocks, and so its reachable peak, are lower than the datasheet's.
POWER_TOLERANCE = 0.10


@dataclass(frozen=True)
class Peak:
    name: str
    fp32: float
    tf32: float
    bf16: float
    fp16: float
    sms: int  # multiprocessors of the whole part (CUs per GCD on MI250/MI250X)
    board_w: float | None  # datasheet maximum board power (TDP/TBP); None: not checked

    def for_precision(self, precision: str) -> float:
        if precision in ("bf16-mixed", "bf16-true"):
            return self.bf16
        if precision == "fp16-mixed":
            return self.fp16
        return self.tf32 if precision == "tf32" else self.fp32

    @property
    def unit(self) -> str:
        return "CUs" if self.name.startswith("AMD") else "SMs"


# Dense peaks in FLOP/s (a datasheet's "with sparsity" figures halved). Sources:
# - NVIDIA A100 datasheet: 19.5 fp32, 156 tf32, 312 bf16/fp16 — SXM and PCIe alike.
# - NVIDIA H100 datasheet, per form factor: SXM 67 / 494.5 / 989; PCIe 51 / 378 / 756;
#   NVL 60 / 417.5 / 835.5 (fp32 / tf32 / bf16 = fp16). Same chip name, three clocks
#   and power limits: a PCIe or NVL card given SXM peaks would report an MFU 1.3x or
#   1.2x too low.
# - NVIDIA H200 datasheet: SXM as H100 SXM; H200 NVL 60 / 417.5 / 835.5.
# - AMD MI250X datasheet (one OAM = 2 GCDs): 95.7 fp32 matrix, 383 bf16/fp16 -> halved
#   per GCD; torchtitan tools/utils.py uses the same 191.5e12 (its #920/#928).
# - AMD MI250 datasheet (fewer CUs: 208 against 220): 90.5 fp32 matrix, 362.1 bf16/fp16
#   per OAM -> 45.25 / 181.05 per GCD.
# Multiprocessors (what torch.cuda.get_device_properties().multi_processor_count reports
# for the whole part):
# - A100 108 SMs, SXM and PCIe (deviceQuery on an A100 40GB prints "(108) Multiprocessors";
#   XLA's GPU target table: A100-SXM4-40GB, A100-SXM4-80GB and A100 80GB PCIe all 108).
# - H100 SXM5 132, H100 PCIe 114 (NVIDIA's H100 SXM/PCIe spec table: "SMs 132 | 114"; XLA's GPU
#   target table agrees: "NVIDIA H100 80GB HBM3" 132, "NVIDIA H100 PCIe" 114, and the
#   MIG slice "NVIDIA H100 80GB HBM3 MIG 1g.10gb" 16 — the name torch reports for a
#   slice, as also printed by torch.cuda.get_device_name() in public MIG tutorials).
# - H100 NVL 132, H200 132 (XLA's table: "NVIDIA H200 141GB HBM3e" 132), H200 NVL 132:
#   all the 16,896-core GH100 bin. NVIDIA's NVL datasheets give no SM count; 132 is
#   from spec listings (16,896 cores / 128 per SM), so an NVL card that reports another
#   count loses its peak here (with a note) rather than get a wrong one.
#   GH200 (maps to "h200") carries the same 132-SM GPU.
# - MI250X 220 CUs per OAM, MI250 208 (AMD Instinct MI200 datasheet) -> 110 / 104 per GCD.
# MIG slices have far fewer: A100 1g.5gb 14 SMs, H100/H200 1g 16 (nvidia-smi mig -lgip);
# even the whole-GPU 7g profile has fewer than the part (A100 7g.40gb: 98 of 108).
# Board power (datasheet maximum; a part "configurable" below it runs slower clocks):
# - A100 SXM4 400 W; A100 PCIe 40GB 250 W, 80GB 300 W (board_power_w below picks by name).
# - H100 SXM up to 700 W; H100 PCIe 300-350 W ("operates unconstrained up to its maximum
#   thermal design power (TDP) level of 350 W", H100 PCIe product brief PB-11133-001);
#   H100 NVL 350-400 W. H200 SXM up to 700 W, H200 NVL up to 600 W.
# - AMD: not checked. NVML does not see AMD GPUs, and amd-smi reports one budget for
#   an OAM whose two GCDs are two ranks.
PEAKS: dict[str, Peak] = {
    "a100": Peak("NVIDIA A100", 19.5 * TERA, 156 * TERA, 312 * TERA, 312 * TERA, 108, 400.0),
    "h100": Peak("NVIDIA H100 SXM", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA, 132, 700.0),
    "h100-pcie": Peak("NVIDIA H100 PCIe", 51 * TERA, 378 * TERA, 756 * TERA, 756 * TERA, 114, 350.0),
    "h100-nvl": Peak("NVIDIA H100 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA, 132, 400.0),
    "h200": Peak("NVIDIA H200", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA, 132, 700.0),
    "h200-nvl": Peak("NVIDIA H200 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA, 132, 600.0),
    "mi250x-gcd": Peak("AMD MI250X (one GCD)", 47.85 * TERA, 47.85 * TERA, 191.5 * TERA, 191.5 * TERA, 110, None),
    "mi250-gcd": Peak("AMD MI250 (one GCD)", 45.25 * TERA, 45.25 * TERA, 181.05 * TERA, 181.05 * TERA, 104, None),
}


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
    return "a100" if "A100" in n else None


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
    except Exception as e:  # noqa: BLE001 - any NVML failure just means "not checked"
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
