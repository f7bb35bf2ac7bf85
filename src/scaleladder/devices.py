"""Peak dense FLOP/s per device and precision: the MFU denominator.

Numbers are vendor datasheet peaks for dense (non-sparse) math, per *device a
rank owns*. The trap (torchtitan #920/#928): an MI250X card is two GCDs and
each GCD is one rank, so its peak is the card's 383 TF/s bf16 halved, 191.5.
MI250X has no TF32 mode; ``tf32`` there runs fp32 matrix math.

A device not in the table gets no peak, and MFU is recorded as NaN rather
than guessed (``--peak-tflops`` supplies one by hand).
"""

from __future__ import annotations

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


# Dense peaks in FLOP/s. Sources: NVIDIA A100/H100/H200 datasheets (SXM), AMD MI250X
# datasheet divided by its 2 GCDs; torchtitan tools/utils.py uses the same bf16 values.
PEAKS: dict[str, Peak] = {
    "a100": Peak("NVIDIA A100", 19.5 * TERA, 156 * TERA, 312 * TERA, 312 * TERA),
    "h100": Peak("NVIDIA H100 SXM", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA),
    "h200": Peak("NVIDIA H200", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA),
    "mi250x-gcd": Peak("AMD MI250X (one GCD)", 47.85 * TERA, 47.85 * TERA, 191.5 * TERA, 191.5 * TERA),
}


def device_key(name: str) -> str | None:
    """Map ``torch.cuda.get_device_name()`` to a PEAKS key (None when unknown)."""
    n = name.upper()
    if "MI250" in n or "GFX90A" in n:  # ROCm may report "AMD Instinct MI250X" or the gfx id
        return "mi250x-gcd"
    for key in ("h200", "h100", "a100"):
        if key.upper() in n:
            return key
    return None


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
