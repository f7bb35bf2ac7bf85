"""The MFU denominator: peak dense FLOP/s per device a rank owns, per precision."""

from __future__ import annotations

import math

import pytest
import torch

from scaleladder.devices import PEAKS, device_key, peak_flops


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
    assert math.isnan(peak_flops(torch.device("cpu"), "bf16-mixed"))  # never a guessed number
    assert peak_flops(torch.device("cpu"), "bf16-mixed", override_tflops=100.0) == 100e12
