"""Peak dense FLOP/s per device and precision: the MFU denominator.

Numbers are vendor datasheet peaks for dense (non-sparse) math, per *device a
rank owns*. The trap (torchtitan #920/#928): an MI250X card is two GCDs and
each GCD is one rank, so its peak is the card's 383 TF/s bf16 halved, 191.5.
MI250X has no TF32 mode; ``tf32`` there runs fp32 matrix math.

A device not in the table gets no peak, and MFU is recorded as NaN rather
than guessed (``--peak-tflops`` supplies one by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    name: str
    fp32: float
    tf32: float
    bf16: float
    fp16: float

    def for_precision(self, precision: str) -> float:
        if precision in ("bf16-mixed", "bf16-true"):
            return self.bf16
        if precision == "fp16-mixed":
            return self.fp16
        return self.tf32 if precision == "tf32" else self.fp32


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
PEAKS: dict[str, Peak] = {
    "a100": Peak("NVIDIA A100", 19.5 * TERA, 156 * TERA, 312 * TERA, 312 * TERA),
    "h100": Peak("NVIDIA H100 SXM", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA),
    "h100-pcie": Peak("NVIDIA H100 PCIe", 51 * TERA, 378 * TERA, 756 * TERA, 756 * TERA),
    "h100-nvl": Peak("NVIDIA H100 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA),
    "h200": Peak("NVIDIA H200", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA),
    "h200-nvl": Peak("NVIDIA H200 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA),
    "mi250x-gcd": Peak("AMD MI250X (one GCD)", 47.85 * TERA, 47.85 * TERA, 191.5 * TERA, 191.5 * TERA),
    "mi250-gcd": Peak("AMD MI250 (one GCD)", 45.25 * TERA, 45.25 * TERA, 181.05 * TERA, 181.05 * TERA),
}


def device_key(name: str) -> str | None:
    """Map ``torch.cuda.get_device_name()`` to a PEAKS key (None when unknown or ambiguous).

    TRAP: ROCm's marketing names come from the PCI id, and id 0x740c is named
    "AMD Instinct MI250X / MI250" — either card; a bare "gfx90a" is MI210, MI250 or
    MI250X. Both are ambiguous between peaks 5% apart, so they get no peak: MFU is NaN
    unless ``--peak-tflops`` says which. (Frontier's MI250X, id 0x7408, reports
    "AMD Instinct MI250X".)
    """
    n = " ".join(name.upper().split())
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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def peak_flops(device: torch.device, precision: str, override_tflops: float | None = None) -> float:
    """Peak FLOP/s for one rank's device, or NaN when unknown (CPU included)."""
    if override_tflops is not None:
        return override_tflops * TERA
    key = device_key(device_name(device)) if device.type == "cuda" else None
    return PEAKS[key].for_precision(precision) if key else float("nan")
