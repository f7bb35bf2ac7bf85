"""The MFU denominator: peak dense FLOP/s per device a rank owns, per precision; and the
refusals — a MIG slice, a different part under the same name, a power-capped card get
no peak (NaN MFU) and a note saying why."""

from __future__ import annotations

import math

import pytest
import torch

from scaleladder.planner.devices import PEAKS
from scaleladder.rung import device_peak, provenance
from scaleladder.rung.device_peak import device_key, peak_for, peak_info, rank_device_peak_flops


@pytest.mark.parametrize(
    "key,bf16",
    [("a100", 312e12), ("h100", 989e12), ("h200", 989e12), ("mi250x-gcd", 191.5e12), ("mi250-gcd", 181.05e12),
     ("h100-pcie", 756e12), ("h100-nvl", 835.5e12)],
)
def test_bf16_peaks(key: str, bf16: float) -> None:
    assert PEAKS[key].for_precision("bf16-mixed") == PEAKS[key].for_precision("bf16-true") == pytest.approx(bf16)


def test_mi250x_is_per_gcd_not_per_card() -> None:
    # torchtitan #920/#928: the card's 383 TF/s counted for one rank halves every MFU.
    assert PEAKS["mi250x-gcd"].bf16 == pytest.approx(383e12 / 2)
    assert PEAKS["mi250x-gcd"].fp32 == pytest.approx(95.7e12 / 2)


def test_precisions_pick_their_column() -> None:
    a100 = PEAKS["a100"]
    assert a100.for_precision("fp32") == 19.5e12 and a100.for_precision("tf32") == 156e12
    assert a100.for_precision("fp16-mixed") == 312e12


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),  # same peaks as SXM
        ("NVIDIA H100 80GB HBM3", "h100"),  # what an H100 SXM reports
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA GH200 480GB", "h200"),  # Grace Hopper: an H100 SXM-class GPU, same peaks
        ("AMD Instinct MI250X", "mi250x-gcd"),  # Frontier, PCI id 0x7408
        ("AMD Instinct MI250", "mi250-gcd"),
        ("AMD Instinct MI250X / MI250", None),  # PCI id 0x740c: either card
        ("gfx90a", None),  # MI210, MI250 or MI250X
        ("AMD Instinct MI210", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_device_names_map_to_their_own_peaks(name: str, key: str | None) -> None:
    assert device_key(name) == key


def test_no_peak_without_a_known_device_and_override_wins() -> None:
    assert math.isnan(rank_device_peak_flops(torch.device("cpu"), "bf16-mixed"))  # never a guessed number
    assert rank_device_peak_flops(torch.device("cpu"), "bf16-mixed", override_tflops=100.0) == 100e12


# -- which part a rank owns: its name, its SM (CU) count, its power limit ------------------
# Real names with the multiprocessor count torch reports for them (XLA's GPU target table,
# `nvidia-smi mig -lgip` listings, AMD's MI200 datasheet halved per GCD).

WHOLE_PARTS = [
    ("NVIDIA A100-SXM4-40GB", 108, 400.0, 312e12),
    ("NVIDIA A100-PCIE-40GB", 108, 250.0, 312e12),  # its own board power, not the SXM's 400 W
    ("NVIDIA A100 80GB PCIe", 108, 300.0, 312e12),
    ("NVIDIA H100 80GB HBM3", 132, 700.0, 989e12),
    ("NVIDIA H100 PCIe", 114, 350.0, 756e12),
    ("NVIDIA H100 NVL", 132, 400.0, 835.5e12),
    ("NVIDIA H200 141GB HBM3e", 132, 700.0, 989e12),
    ("NVIDIA H200 NVL", 132, 600.0, 835.5e12),
]


@pytest.mark.parametrize("name,sms,power,bf16", WHOLE_PARTS)
def test_a_whole_part_at_full_power_gets_its_peak_and_no_note(name: str, sms: int, power: float, bf16: float) -> None:
    info = peak_for(name, sms, power, "bf16-mixed")
    assert info.flops == pytest.approx(bf16) and info.note == ""
    assert info.sm_count == sms and info.power_limit_w == power


@pytest.mark.parametrize(
    "name,sms,full",
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 132),  # what torch.cuda.get_device_name() says on a slice
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60, 132),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, 108),
        ("NVIDIA A100-SXM4-40GB MIG 7g.40gb", 98, 108),  # even the whole-GPU profile has fewer SMs
        ("NVIDIA H200 141GB HBM3e MIG 1g.18gb", 16, 132),
    ],
)
def test_a_mig_slice_gets_no_peak_and_says_why(name: str, sms: int, full: int) -> None:
    info = peak_for(name, sms, 700.0, "bf16-mixed")
    assert math.isnan(info.flops)
    assert f"reports {sms} SMs" in info.note and f"has {full}" in info.note and "--peak-tflops" in info.note


@pytest.mark.parametrize(
    "name,sms,unit,full",
    [
        # the trap the issue names: a slice (or a cut-down part) that reports the full chip's name
        ("NVIDIA H100 80GB HBM3", 16, "SMs", 132),
        ("NVIDIA H100 PCIe", 132, "SMs", 114),  # not an SXM part just because it has more SMs
        ("NVIDIA A100-SXM4-80GB", 98, "SMs", 108),
        ("AMD Instinct MI250X", 104, "CUs", 110),  # an MI250 GCD reporting the X's name
        ("AMD Instinct MI250", 110, "CUs", 104),
    ],
)
def test_a_count_that_is_not_the_parts_refuses_the_peak(name: str, sms: int, unit: str, full: int) -> None:
    info = peak_for(name, sms, None, "bf16-mixed")
    assert math.isnan(info.flops) and f"reports {sms} {unit}, the table's" in info.note and f"has {full}" in info.note


def test_mi250x_gcd_gets_its_peak_and_says_power_was_not_checked() -> None:
    info = peak_for("AMD Instinct MI250X", 110, None, "bf16-mixed", power_unread="NVML does not see AMD GPUs")
    assert info.flops == pytest.approx(191.5e12)
    assert info.note.startswith("power limit not checked")


@pytest.mark.parametrize(
    "name,sms,limit,capped",
    [
        ("NVIDIA H100 80GB HBM3", 132, 500.0, True),   # 29% below 700 W
        ("NVIDIA H100 80GB HBM3", 132, 640.0, False),  # within 10%
        ("NVIDIA H100 PCIe", 114, 300.0, True),        # the low end of its 300-350 W range
        ("NVIDIA A100-SXM4-40GB", 108, 250.0, True),
        ("NVIDIA A100-PCIE-40GB", 108, 250.0, False),  # its datasheet power: not capped
        ("NVIDIA H200 NVL", 132, 450.0, True),
    ],
)
def test_a_power_capped_part_gets_no_peak(name: str, sms: int, limit: float, capped: bool) -> None:
    info = peak_for(name, sms, limit, "bf16-mixed")
    assert math.isnan(info.flops) is capped
    assert ("power-capped" in info.note) is capped and info.power_limit_w == limit


def test_without_nvml_the_peak_stands_and_the_record_says_power_was_not_checked() -> None:
    info = peak_for("NVIDIA H100 80GB HBM3", 132, None, "bf16-mixed", power_unread="pynvml (nvidia-ml-py) not installed")
    assert info.flops == pytest.approx(989e12) and math.isnan(info.power_limit_w)
    assert info.note == "power limit not checked (pynvml (nvidia-ml-py) not installed)"


def test_gh200_has_no_per_gpu_board_power_to_compare() -> None:
    info = peak_for("NVIDIA GH200 480GB", 132, 450.0, "bf16-mixed")  # one module budget for CPU + GPU
    assert info.flops == pytest.approx(989e12) and "not checked" in info.note


def test_unknown_and_ambiguous_names_say_so() -> None:
    for name in ("NVIDIA GeForce RTX 4090", "AMD Instinct MI250X / MI250"):
        info = peak_for(name, 128, None, "bf16-mixed")
        assert math.isnan(info.flops) and "not in the peak table or is ambiguous" in info.note


def test_the_override_wins_over_a_refusal_and_keeps_the_tables_word() -> None:
    info = peak_for("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 700.0, "bf16-mixed", override_tflops=120.0)
    assert info.flops == 120e12
    assert info.note.startswith("peak from --peak-tflops 120 (the table: ") and "reports 16 SMs" in info.note


class _Props:
    def __init__(self, sms: int) -> None:
        self.multi_processor_count = sms
        self.pci_domain_id, self.pci_bus_id, self.pci_device_id = 0, 0x3B, 0


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str, sms: int, power: float | None) -> torch.device:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: _Props(sms))
    monkeypatch.setattr(device_peak, "nvml_power_limit_w", lambda d: (power, "" if power is not None else "no NVML here"))
    return torch.device("cuda", 0)


def test_peak_flops_of_a_mig_slice_is_nan_not_the_whole_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the runner calls for MFU: name-only matching gave this slice 989 TF/s."""
    cuda0 = _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 700.0)
    assert math.isnan(rank_device_peak_flops(cuda0, "bf16-mixed"))
    assert rank_device_peak_flops(cuda0, "bf16-mixed", override_tflops=100.0) == 100e12


def test_peak_flops_of_a_capped_h100_is_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda0 = _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132, 400.0)
    assert math.isnan(rank_device_peak_flops(cuda0, "bf16-mixed"))
    cuda0 = _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132, 700.0)
    assert rank_device_peak_flops(cuda0, "bf16-mixed") == pytest.approx(989e12)


def test_the_record_gets_the_sm_count_power_and_note_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """provenance.peak_attrs is the one line the runner adds to a rung's attributes."""
    cuda0 = _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, None)
    a = provenance.peak_attrs(cuda0, "bf16-mixed", None)
    assert a["device_sm_count"] == 16 and math.isnan(a["device_power_limit_w"])
    assert a["peak_note"] == ("NVIDIA H100 80GB HBM3 MIG 1g.10gb reports 16 SMs, the table's NVIDIA H100 SXM has 132: "
                              "a MIG slice or a different part; MFU not computed (give --peak-tflops)")
    cpu = provenance.peak_attrs(torch.device("cpu"), "fp32", None)
    assert cpu["device_sm_count"] == 0 and "CPU" in cpu["peak_note"]
    assert peak_info(torch.device("cpu"), "fp32", 5.0).note == "peak from --peak-tflops 5"
    assert all(v is not None for v in a.values())  # HDF5 stores no None


def test_nvml_absent_is_reported_not_raised() -> None:
    power, why = device_peak.nvml_power_limit_w(torch.device("cuda", 0))
    if power is None:  # this CPU machine: no pynvml, or no driver behind it
        assert why
