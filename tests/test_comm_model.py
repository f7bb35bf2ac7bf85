"""planner/comm.py's per-collective links and gloo's algorithms, and overlap.py's device
overlap, on hand-computed cases. Torch-free, milliseconds."""

from __future__ import annotations

import pytest

from scaleladder.errors import SpecError
from scaleladder.planner.comm import Link, all_gather_s, all_reduce_s, links_from_profile, reduce_scatter_s, terms
from scaleladder.planner.overlap import Stage, schedule


def test_gloo_reduce_scatter_is_an_all_reduce_of_the_whole_tensor() -> None:
    # ProcessGroupGloo's reduce_scatter_tensor clones the input, all-reduces it whole, copies its chunk
    nccl, gloo = Link(10e-6, 1e9), Link(10e-6, 1e9, backend="gloo")
    assert reduce_scatter_s(1e6, 4, nccl) == pytest.approx(3 * 10e-6 + 0.75 * 1e6 / 1e9)  # 780 us, a ring RS
    assert reduce_scatter_s(1e6, 4, gloo) == pytest.approx(6 * 10e-6 + 1.5 * 1e6 / 1e9)  # 1.56 ms, a ring AR
    assert reduce_scatter_s(1e6, 4, gloo) == pytest.approx(all_reduce_s(1e6, 4, gloo))
    # gloo has no tree: 8 ranks, a small message, slow latency: NCCL's tree wins, gloo runs the ring
    slow_nccl, slow_gloo = Link(1e-3, 1e10), Link(1e-3, 1e10, backend="gloo")
    assert all_reduce_s(8.0, 8, slow_nccl) == pytest.approx(2 * 3 * 1e-3 + 2 * 8.0 / 1e10)
    assert all_reduce_s(8.0, 8, slow_gloo) == pytest.approx(2 * 7 * 1e-3 + 2 * 7 / 8 * 8.0 / 1e10)
    assert terms("reduce_scatter", 2, "gloo") == (2.0, 1.0) and terms("all_gather", 4) == (3.0, 0.75)
    assert terms("all_reduce", 1) == (0.0, 0.0)


def test_a_collective_uses_its_own_figures_and_shares_them_out() -> None:
    raw = {"backend": "gloo",
           "intra_node": {"alpha_us": 300, "gbps": 0.5, "all_gather": {"alpha_us": 1000, "gbps": 0.1}},
           "inter_node": {"alpha_us": 400, "gbps": 1.0}}
    links, note = links_from_profile(raw, "timing.links")
    assert links is not None and note == ""
    intra = links.intra_node
    assert intra.backend == "gloo" and intra.figures("all_gather") == pytest.approx((1e-3, 0.1e9))
    assert intra.figures("all_reduce") == pytest.approx((300e-6, 0.5e9))  # the link's own
    # a 64 MiB gather over 2 ranks: 1 latency + half the bytes at its own 0.1 GB/s
    s = 64 * 2**20
    assert all_gather_s(s, 2, intra) == pytest.approx(1e-3 + 0.5 * s / 0.1e9)
    assert all_reduce_s(s, 2, intra) == pytest.approx(2 * 300e-6 + s / 0.5e9)
    # a node's 2 ranks share its link: every collective's bandwidth halves, the latency stays
    half = intra.per_rank(2)
    assert half.figures("all_gather") == pytest.approx((1e-3, 0.05e9)) and half.beta_bps == pytest.approx(0.25e9)
    # the 4-rank world group across 2 nodes of 2 ranks is held to the inter link shared by 2
    assert links.for_group(4, 1, 2).figures("all_reduce") == pytest.approx((400e-6, 0.5e9))


def test_bad_link_figures_are_one_line() -> None:
    with pytest.raises(SpecError, match=r"timing.links.intra_node.all_gather: needs alpha_us"):
        links_from_profile({"intra_node": {"alpha_us": 1, "gbps": 1, "all_gather": {"gbps": 1}},
                            "inter_node": {"alpha_us": 1, "gbps": 1}}, "timing.links")
    with pytest.raises(SpecError, match=r"timing.links.backend must be one of nccl, gloo, got 'mpi'"):
        links_from_profile({"backend": "mpi", "intra_node": {"alpha_us": 1, "gbps": 1},
                            "inter_node": {"alpha_us": 1, "gbps": 1}}, "timing.links")


def test_a_device_that_cannot_overlap_adds_compute_and_communication() -> None:
    # one unit's gather hides behind the previous unit's compute on a GPU (overlap 1) ...
    stages = [Stage(1.0, 0.3), Stage(1.0, 0.3, 0.5)]
    assert schedule(stages).total_s == pytest.approx(0.3 + 2.0 + 0.5)  # the 2nd gather hidden
    # ... and nothing hides on a CPU rank with gloo (overlap 0: measured), half of it at 0.5
    assert schedule(stages, 0.0).total_s == pytest.approx(2.0 + 1.1)
    assert schedule(stages, 0.0).exposed_s == pytest.approx(1.1)
    assert schedule(stages, 0.5).total_s == pytest.approx((2.8 + 3.1) / 2)
