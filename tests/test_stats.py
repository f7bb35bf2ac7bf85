"""results/stats.py: the within-run interval (batch means) and the between-run spread."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import write_rung
from scaleladder.results.aggregate import aggregate, read_ladder, split_repeat
from scaleladder.results.stats import MIN_STEPS, batch_means, between_runs, overlap, t975, within_run
from scaleladder.spec import SpecError


def ar1(rng: np.random.Generator, series: int, n: int, phi: float, mean: float = 0.1, sd: float = 0.01) -> np.ndarray:
    """``series`` AR(1) step-time series of length n around ``mean`` (stationary start)."""
    x = np.empty((series, n))
    x[:, 0] = rng.normal(0, sd / math.sqrt(1 - phi**2), series)
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + rng.normal(0, sd, series)
    return mean + x


def coverage(x: np.ndarray, mean: float, iid: bool) -> float:
    hits = 0
    for row in x:
        if iid:
            m, half = row.mean(), t975(row.size - 1) * row.std(ddof=1) / math.sqrt(row.size)
        else:
            m, half, _, note = batch_means(row)
            assert note == ""
        hits += abs(m - mean) <= half
    return hits / len(x)


def test_batch_means_survive_autocorrelated_steps_where_the_iid_interval_does_not() -> None:
    x = ar1(np.random.default_rng(0), 400, 100, phi=0.7)
    bm, naive = coverage(x, 0.1, iid=False), coverage(x, 0.1, iid=True)
    # 10 batches of 10 steps at phi 0.7 still under-estimate the variance a little (~0.9
    # measured with this seed); the i.i.d. interval covers ~60%.
    assert bm >= 0.85, bm
    assert naive <= 0.75, naive
    assert bm - naive >= 0.2


def test_on_independent_steps_the_interval_covers_about_95_percent() -> None:
    x = 0.1 + np.random.default_rng(1).normal(0, 0.01, (400, 64))
    assert 0.90 <= coverage(x, 0.1, iid=False) <= 0.99


def test_a_short_window_has_no_interval_and_says_why() -> None:
    a = within_run(np.full(6, 0.1), warmup=2, items_per_s=100.0)  # the local profile's 6 steps, 2 warm-up
    assert math.isnan(a["items_per_s_ci_low"]) and math.isnan(a["items_per_s_ci_high"])
    assert "4 measured steps" in a["ci_note"] and str(MIN_STEPS) in a["ci_note"]
    assert a["ci_steps"] == 4 and a["items_per_s_median"] == pytest.approx(100.0)


def test_the_throughput_interval_holds_the_headline_and_swaps_the_bounds() -> None:
    steps = np.r_[[1.0, 1.0], ar1(np.random.default_rng(2), 1, 36, phi=0.5)[0]]  # 2 slow warm-up steps
    a = within_run(steps, warmup=2, items_per_s=320.0)
    assert a["ci_note"] == "" and a["ci_method"].startswith("batch means: 6 batches of 6 steps")
    assert a["items_per_s_ci_low"] < 320.0 < a["items_per_s_ci_high"]
    mean, half, _, _ = batch_means(steps[2:])
    assert a["items_per_s_ci_low"] == pytest.approx(320.0 * mean / (mean + half))
    assert a["items_per_s_median"] == pytest.approx(320.0 * mean / np.median(steps[2:]))


def test_identical_steps_give_a_zero_width_interval_not_a_made_up_one() -> None:
    a = within_run(np.full(20, 0.1), warmup=0, items_per_s=40.0)
    assert a["items_per_s_ci_low"] == pytest.approx(40.0) and a["items_per_s_ci_high"] == pytest.approx(40.0)


def test_between_runs_the_seeds_three_epochs() -> None:
    s = between_runs([780.0, 919.0, 1008.0])  # the ViT seed's log: three identical epochs
    assert s["items_per_s"] == pytest.approx(902.33, abs=0.01)
    assert s["items_per_s_ci_low"] < 780 and s["items_per_s_ci_high"] > 1008  # t(2) = 4.3: three runs say little
    assert s["between_run_cv"] == pytest.approx(np.std([780, 919, 1008], ddof=1) / 902.333, rel=1e-4)
    assert s["repeats"] == 3 and "t(2) over 3 repeats" in s["ci_method"]
    with pytest.raises(ValueError, match="at least 2"):
        between_runs([780.0])


def test_overlap_is_unknown_without_an_interval() -> None:
    assert overlap((1, 2), (1.5, 3)) is True
    assert overlap((1, 2), (2.5, 3)) is False
    assert overlap((1, math.nan), (1.5, 3)) is None
    assert overlap((1, math.inf), (5, 6)) is True


def _repeat(first: Path, k: int, **attrs: float) -> Path:
    dst = Path(str(first).removesuffix(".h5") + f".r{k}.h5")
    shutil.copy(first, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs.update(attrs)
    return dst


def test_aggregate_keeps_every_repeat_and_the_spread_between_them(tmp_path: Path) -> None:
    r0 = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", items_per_s=439.1, steps=20)
    files = [r0, _repeat(r0, 1, items_per_s=537.3), _repeat(r0, 2, items_per_s=480.0)]
    single = write_rung(tmp_path, "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", items_per_s=200.0, steps=20)
    assert split_repeat(str(files[2])) == (str(r0), 2)
    out = tmp_path / "ladder.h5"
    assert aggregate([str(f) for f in [*files, single]], str(out)) == {"ok": 2}
    rungs, root = read_ladder(str(out))
    assert len(rungs) == 2 and root["n_rungs"] == 2  # repeats are not rungs of their own
    r = next(x for x in rungs if x["strategy"] == "ddp")
    assert r["repeats"] == 3 and r["items_per_s_repeats"] == [439.1, 537.3, 480.0]
    assert r["items_per_s"] == pytest.approx(np.mean([439.1, 537.3, 480.0]))
    assert r["items_per_s_ci_low"] < 439.1 and r["items_per_s_ci_high"] > 537.3
    assert r["samples_per_s"] == pytest.approx(r["items_per_s"] / 2)  # write_rung: samples = items / 2
    assert r["mfu"] == pytest.approx(0.3 * r["items_per_s"] / 439.1)  # rates follow the headline
    assert r["within_run_rel_halfwidth"] == pytest.approx(0.0)  # write_rung's steps are all 0.1 s
    with h5py.File(out, "r") as f:
        g = f["rungs/vit-debug/ddp/fp32/pre-lag/n1/b4/repeats"]
        assert sorted(g) == ["r0", "r1", "r2"] and g["r1"].attrs["items_per_s"] == 537.3
        assert g["r2"]["step_time_s"].shape == (20,)
    s = next(x for x in rungs if x["strategy"] == "fsdp-full")
    assert "repeats" not in s and s["ci_method"].startswith("batch means")  # filled from its step times


def test_a_repeat_that_ran_out_of_memory_makes_the_rung_oom(tmp_path: Path) -> None:
    r0 = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", steps=20)
    oom = _repeat(r0, 1)
    with h5py.File(oom, "r+") as f:
        f.attrs["status"] = "oom"
    out = tmp_path / "ladder.h5"
    assert aggregate([str(r0), str(oom)], str(out)) == {"oom": 1}
    (r,), _ = read_ladder(str(out))
    assert r["status"] == "oom" and r["repeat_statuses"] == '["ok", "oom"]'


def test_a_missing_repeat_is_named(tmp_path: Path) -> None:
    r0 = write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4")
    r2 = _repeat(r0, 2)
    with pytest.raises(SpecError, match=r"repeat\(s\) \[1\] missing"):
        aggregate([str(r0), str(r2)], str(tmp_path / "ladder.h5"))


def test_scattered_repeats_bound_the_throughput_from_above_only() -> None:
    s = between_runs([162.3, 314.0, 465.0])  # three repeats of one rung on a loaded 2-core VM
    assert s["items_per_s_ci_low"] == 0.0 and s["items_per_s_ci_high"] > 465.0


def test_t_quantiles_are_exact_not_the_normal_above_30() -> None:
    # 1.96 above 30 degrees of freedom made intervals ~4% too narrow at t(31)
    from scaleladder.results.stats import t_quantile

    published = {1: 12.7062, 2: 4.3027, 3: 3.1824, 9: 2.2622, 30: 2.0423, 31: 2.0395, 40: 2.0211, 60: 2.0003, 120: 1.9799}
    for dof, t in published.items():
        assert t975(dof) == pytest.approx(t, abs=1e-4), dof
    assert t_quantile(10, 0.90) == pytest.approx(1.8125, abs=1e-4)
    try:
        from scipy import stats as sps  # not a dependency; where it is installed, hold the two together
    except ImportError:
        return
    for dof in range(1, 301):
        assert t975(dof) == pytest.approx(float(sps.t.ppf(0.975, dof)), rel=1e-10), dof


def test_each_interval_stores_its_standard_error_and_degrees_of_freedom() -> None:
    from scaleladder.results.stats import t_quantile

    steps = np.r_[[1.0, 1.0], ar1(np.random.default_rng(3), 1, 36, phi=0.5)[0]]
    a = within_run(steps, warmup=2, items_per_s=320.0)
    mean, half, _, _ = batch_means(steps[2:])
    assert a["ci_dof"] == 5  # 6 batches of 6
    assert a["items_per_s_se"] == pytest.approx(320.0 * half / t_quantile(5) / mean)
    short = within_run(np.full(6, 0.1), warmup=2, items_per_s=100.0)
    assert short["ci_dof"] == 0 and math.isnan(short["items_per_s_se"])
    s = between_runs([100.0, 102.0, 98.0])
    assert s["ci_dof"] == 2 and s["items_per_s_se"] == pytest.approx(2.0 / math.sqrt(3))
    assert s["items_per_s_ci_high"] - s["items_per_s"] == pytest.approx(t_quantile(2) * s["items_per_s_se"])
