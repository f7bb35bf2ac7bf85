"""The one device table: per chip, its dense peaks per precision, its multiprocessors, its
board power, and the memory variants the planner plans for, each with its HBM bandwidth.

A row is a chip, :class:`Peak`, keyed by the name the runner's MFU uses (``a100``,
``mi250x-gcd``); its ``memories`` are the planner's device keys (``a100-40gb``,
``a100-80gb``), each a :class:`Memory`: the memory PyTorch reports and the datasheet's HBM
bandwidth. So an ``a100`` peak serves the 40 and 80 GB memories, and a chip may have no
memory row yet (``h100-pcie``: it has a peak for MFU, but nothing to plan for). ``cpu`` is
a planner device with no chip (:data:`CHIPLESS`): unlimited memory, no peak for MFU, and
stated figures for the step time.

Read by the planner (:data:`DEVICES`, through ``planner/memory.py``; :func:`step_figures`,
through ``planner/rates.py``), by the runner (``rung/device_peak.py``: a rank's device
matched by name, SMs and power, for its MFU) and by ``scaleladder budget``
(``campaign/cost.py``: a ``plan_device``'s peak). A new GPU is one :class:`Peak` row here.
What was measured on a device (its achieved rates) is not here but in
``planner/calibration/<device>.json``. Torch-free: the planner and the budget run on a
login node.

Peaks are vendor datasheet peaks for dense (non-sparse) math, per *device a rank owns*.
The trap (torchtitan #920/#928): an MI250X card is two GCDs and each GCD is one rank, so
its peak is the card's 383 TF/s bf16 halved, 191.5. MI250X has no TF32 mode; ``tf32``
there runs fp32 matrix math.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

TERA = 1e12
GIB = 2**30


@dataclass(frozen=True)
class Memory:
    """One memory variant of a chip: a planner device."""

    key: str  # the planner's device key (``a100-40gb``)
    gib: float  # the total capacity PyTorch reports for it, in GiB
    hbm_gbps: float | None = None  # the datasheet's HBM bandwidth, GB/s; None: no step time for it


@dataclass(frozen=True)
class Chipless:
    """A planner device with no chip: no datasheet, so what the step time needs is stated."""

    memory: int | None  # usable bytes; None: unlimited
    peak_flops: float  # STATED, every precision
    hbm_gbps: float  # STATED memory bandwidth, GB/s


@dataclass(frozen=True)
class Peak:
    """One chip: its datasheet peaks and, for the planner, its memory variants."""

    name: str
    fp32: float
    tf32: float
    bf16: float
    fp16: float
    sms: int  # multiprocessors of the whole part (CUs per GCD on MI250/MI250X)
    board_w: float | None  # datasheet maximum board power (TDP/TBP); None: not checked
    # the planner's devices of this chip; () when the planner has no row for the chip yet
    memories: tuple[Memory, ...] = ()
    # a word of torch.cuda.get_device_name() that names this chip, for a chip that
    # rung/device_peak.py's device_key does not know by its traps ("" for the rows it does)
    torch_name: str = ""

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
# - A100 SXM4 400 W; A100 PCIe 40GB 250 W, 80GB 300 W (rung/device_peak.py board_power_w picks by name).
# - H100 SXM up to 700 W; H100 PCIe 300-350 W ("operates unconstrained up to its maximum
#   thermal design power (TDP) level of 350 W", H100 PCIe product brief PB-11133-001);
#   H100 NVL 350-400 W. H200 SXM up to 700 W, H200 NVL up to 600 W.
# - AMD: not checked. NVML does not see AMD GPUs, and amd-smi reports one budget for
#   an OAM whose two GCDs are two ranks.
# Memories: the total capacity PyTorch reports for one rank's device
# (torch.cuda.get_device_properties().total_memory), as printed in its OOM messages:
# "39.59 GiB total capacity" (A100 40GB), "79.15 GiB" (A100 80GB), 79.1–79.3 GiB for
# H100 80GB (driver/ECC dependent; we take the low end), "139.80 GiB" (H200),
# "63.98 GiB" (one MI250X GCD under ROCm).
# HBM bandwidth (vendor datasheets, GB/s, per device a rank owns), for the planner's step time:
# A100 40GB 1555, A100 80GB 2039, H100 SXM 3350, H200 4800, one MI250X GCD 1638 (half the OAM's).
# TRAP: the order of the rows is the order of DEVICES, which error messages and
# `plan --help` list: a new row goes where its chip belongs, and the lists follow.
PEAKS: dict[str, Peak] = {
    "a100": Peak("NVIDIA A100", 19.5 * TERA, 156 * TERA, 312 * TERA, 312 * TERA, 108, 400.0,
                 memories=(Memory("a100-40gb", 39.59, 1555), Memory("a100-80gb", 79.15, 2039))),
    "h100": Peak("NVIDIA H100 SXM", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA, 132, 700.0,
                 memories=(Memory("h100-80gb", 79.10, 3350),)),
    "h100-pcie": Peak("NVIDIA H100 PCIe", 51 * TERA, 378 * TERA, 756 * TERA, 756 * TERA, 114, 350.0),
    "h100-nvl": Peak("NVIDIA H100 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA, 132, 400.0),
    "h200": Peak("NVIDIA H200", 67 * TERA, 494.5 * TERA, 989 * TERA, 989 * TERA, 132, 700.0,
                 memories=(Memory("h200-141gb", 139.80, 4800),)),
    "h200-nvl": Peak("NVIDIA H200 NVL", 60 * TERA, 417.5 * TERA, 835.5 * TERA, 835.5 * TERA, 132, 600.0),
    "mi250x-gcd": Peak("AMD MI250X (one GCD)", 47.85 * TERA, 47.85 * TERA, 191.5 * TERA, 191.5 * TERA, 110, None,
                       memories=(Memory("mi250x-gcd", 63.98, 1638),)),
    "mi250-gcd": Peak("AMD MI250 (one GCD)", 45.25 * TERA, 45.25 * TERA, 181.05 * TERA, 181.05 * TERA, 104, None),
}

# Planner devices with no chip: a CPU rank plans against unlimited memory and has no peak for
# MFU. Its step-time figures are STATED, no datasheet: 0.1 TFLOP/s ~ 2 cores x 16 fp32 FMA
# lanes x 2 x 3 GHz, and 20 GB/s DDR (benchmarks/bench_comm.py's --calibrate writes a
# measured cpu calibration, which planner/rates.py prefers).
CHIPLESS: dict[str, Chipless] = {"cpu": Chipless(None, 0.1 * TERA, 20)}


class _Memories(Mapping[str, int | None]):
    """The planner's device keys and usable bytes, read from :data:`PEAKS` on every look-up.

    A live view, not a copy, so that a row added to PEAKS (a new chip, or a test's fake
    one) is a planner device at once: one row, one place."""

    def _table(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {m.key: int(m.gib * GIB) for peak in PEAKS.values() for m in peak.memories}
        return {**out, **{key: c.memory for key, c in CHIPLESS.items()}}

    def __getitem__(self, key: str) -> int | None:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


#: Usable device memory per planner device key (None: unlimited).
DEVICES: Mapping[str, int | None] = _Memories()


def chip_of(device: str) -> str | None:
    """The PEAKS key of a planner device key (``a100-80gb`` -> ``a100``); None for ``cpu``
    and for a name no row holds."""
    return next((chip for chip, peak in PEAKS.items() if any(m.key == device for m in peak.memories)), None)


def step_figures(device: str, precision: str) -> tuple[float, float] | None:
    """(peak FLOP/s at ``precision``, HBM GB/s) of a planner device, for the step time: the
    datasheet's for a chip's memory, the stated ones for a device with no chip; None where
    the table holds no bandwidth for it (or no such device)."""
    if device in CHIPLESS:
        c = CHIPLESS[device]
        return c.peak_flops, c.hbm_gbps
    for peak in PEAKS.values():
        for m in peak.memories:
            if m.key == device:
                return (peak.for_precision(precision), m.hbm_gbps) if m.hbm_gbps is not None else None
    return None
