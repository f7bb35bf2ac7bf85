"""`scaleladder compare`: verdicts that respect noise, refusals that name the field, references.

The rung files are real HDF5 records whose step times carry planted noise and, where a
test says so, a planted slowdown; the verdicts come from the intervals results/stats.py
computes from those step times, as in a real ladder.
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import write_rung
from scaleladder.cli import main as cli
from scaleladder.results.aggregate import aggregate, read_ladder
from scaleladder.results.compare import compare, judge, load, throughput_change

SPEC = "vit-debug/ddp/fp32/pre-lag/n1/b4"
OTHER = "vit-debug/fsdp-full/fp32/pre-lag/n1/b4"
ITEMS_PER_STEP = 8.0  # b4 on 2 ranks


def rung(root: Path, spec: str, mean_step: float, noise: float, seed: int, steps: int = 42, **attrs: object) -> Path:
    """A measured rung: ``steps`` step times (2 warm-up) around ``mean_step`` with relative
    ``noise``, its items/s from them, as `scaleladder run` computes it."""
    rng = np.random.default_rng(seed)
    times = mean_step * (1 + noise * rng.standard_normal(steps))
    ips = ITEMS_PER_STEP / float(times[2:].mean())
    path = write_rung(root, spec, items_per_s=ips, steps=steps, **attrs)
    with h5py.File(path, "r+") as f:
        del f["step_time_s"]
        f.create_dataset("step_time_s", data=times)
    return path


def ladder(root: Path, *files: Path) -> str:
    out = root / "ladder.h5"
    aggregate([str(f) for f in files], str(out))
    return str(out)


def test_a_planted_slowdown_is_slower_and_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.100, 0.02, 0), rung(tmp_path / "a", OTHER, 0.2, 0.02, 1))
    new = ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.125, 0.02, 2), rung(tmp_path / "b", OTHER, 0.2, 0.02, 3))
    fig = tmp_path / "cmp.png"
    assert cli(["compare", base, new, "--figure", str(fig)]) == 1
    out = capsys.readouterr()
    line = next(x for x in out.out.splitlines() if x.startswith(SPEC))
    assert "slower (REGRESSION)" in line and "-20." in line  # 0.100 -> 0.125 s per step: -20% items/s
    assert SPEC in out.err and OTHER not in out.err
    other = next(x for x in out.out.splitlines() if x.startswith(OTHER))
    assert "same" in other and "within noise" in other
    assert fig.stat().st_size > 0 and fig.read_bytes()[:4] == b"\x89PNG"


def test_a_change_within_noise_is_same_and_exits_zero(tmp_path: Path) -> None:
    # +4% on steps that vary 30% from one to the next: indistinguishable (the issue's
    # HYBRID 1 vs NO_SHARD), though beyond the 2% tolerance.
    b = load(ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.100, 0.3, 0)))
    n = load(ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.096, 0.3, 1)))
    (row,) = compare(b, n, tolerance=0.02)
    assert row.verdict == "same" and "within noise" in row.notes and not row.regressed
    assert row.low < 0 < row.high
    assert cli(["compare", str(tmp_path / "a" / "ladder.h5"), str(tmp_path / "b" / "ladder.h5"), "--tolerance", "0.02",
                "--figure", str(tmp_path / "c.png")]) == 0


def test_the_same_slowdown_at_low_noise_is_caught_and_within_tolerance_is_not_a_regression(tmp_path: Path) -> None:
    b = load(ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.100, 0.005, 0)))
    n = load(ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.104, 0.005, 1)))
    (strict,) = compare(b, n, tolerance=0.02)
    assert strict.verdict == "slower" and strict.high < 0 and strict.regressed
    (lenient,) = compare(b, n, tolerance=0.10)
    assert lenient.verdict == "same" and "within tolerance" in lenient.notes and not lenient.regressed


def test_a_provenance_mismatch_is_refused_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.1, 0.02, 0))
    new = ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.1, 0.02, 1, device_name="NVIDIA H100 80GB HBM3"))
    assert cli(["compare", base, new, "--figure", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"rung {SPEC}: provenance differs in device_name: 'test' (base) vs 'NVIDIA H100 80GB HBM3' (new)" in err
    assert not (tmp_path / "c.png").exists()
    assert cli(["compare", base, new, "--allow-provenance-change", "--figure", str(tmp_path / "c.png")]) == 0
    assert "provenance changed: device_name" in capsys.readouterr().out


def test_world_and_data_are_provenance_too(tmp_path: Path) -> None:
    b = load(ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.1, 0.02, 0)))
    for field, value in (("world_size", 16), ("data", "results/shards/32px/manifest.json")):
        n = load(ladder(tmp_path / field, rung(tmp_path / field, SPEC, 0.1, 0.02, 1, **{field: value})))
        with pytest.raises(Exception, match=f"provenance differs in {field}"):
            compare(b, n)


def test_new_missing_and_oom_changed(tmp_path: Path) -> None:
    b = load(ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.1, 0.02, 0), rung(tmp_path / "a", OTHER, 0.1, 0.02, 1)))
    third = "vit-debug/fsdp-grad-op/fp32/pre-lag/n1/b4"
    n = load(ladder(tmp_path / "b", write_rung(tmp_path / "b", SPEC, status="oom"), rung(tmp_path / "b", third, 0.1, 0.02, 2)))
    rows = {r.spec: r for r in compare(b, n)}
    assert rows[SPEC].verdict == "oom-changed" and rows[SPEC].regressed and rows[SPEC].notes == ["ok -> oom"]
    assert rows[OTHER].verdict == "missing" and not rows[OTHER].regressed
    assert rows[third].verdict == "new" and not rows[third].regressed
    back = {r.spec: r for r in compare(n, b)}
    assert back[SPEC].verdict == "oom-changed" and not back[SPEC].regressed  # it fits again


def test_more_memory_or_a_smaller_max_batch_is_a_regression(tmp_path: Path) -> None:
    max_spec = "vit-debug/ddp/fp32/pre-lag/n1/bmax"
    b = load(ladder(tmp_path / "a", rung(tmp_path / "a", max_spec, 0.1, 0.02, 0, max_batch=16, peak_reserved_gib=10.0)))
    n = load(ladder(tmp_path / "b", rung(tmp_path / "b", max_spec, 0.1, 0.02, 1, max_batch=12, peak_reserved_gib=11.0)))
    (row,) = compare(b, n)
    assert row.regressed and row.max_batch == "16 -> 12" and row.memory == pytest.approx(0.1)
    assert "smaller max batch" in row.notes and "peak memory +10.0%" in row.notes


def test_without_intervals_the_tolerance_decides_and_says_noise_unknown(tmp_path: Path) -> None:
    b = load(ladder(tmp_path / "a", write_rung(tmp_path / "a", SPEC, items_per_s=439.1)))  # 6 steps: no interval
    n = load(ladder(tmp_path / "b", write_rung(tmp_path / "b", SPEC, items_per_s=537.3)))
    (row,) = compare(b, n)
    assert math.isnan(row.low) and row.verdict == "faster"
    assert row.notes[0].startswith("judged on tolerance alone, noise unknown (no interval: 4 measured steps")


def test_the_interval_of_the_change_combines_both_on_the_log_scale() -> None:
    base = {"items_per_s": 100.0, "items_per_s_ci_low": 90.0, "items_per_s_ci_high": 110.0}
    new = {"items_per_s": 100.0, "items_per_s_ci_low": 100.0, "items_per_s_ci_high": 100.0}
    change, low, high = throughput_change(base, new)
    assert change == 0 and low == pytest.approx(math.sqrt(90 / 110) - 1) and high == pytest.approx(math.sqrt(110 / 90) - 1)
    row = judge(SPEC, {"status": "ok", **base}, {"status": "ok", **new}, 0.05, 0.05)
    assert row.verdict == "same"


def test_a_folder_of_rungs_with_repeats_compares_like_its_ladder(tmp_path: Path) -> None:
    a = rung(tmp_path / "a", SPEC, 0.1, 0.02, 0)
    r1 = Path(str(a).removesuffix(".h5") + ".r1.h5")
    r1.write_bytes(a.read_bytes())
    folder = load(str(tmp_path / "a" / "results" / "rungs"))
    assert folder[SPEC]["repeats"] == 2
    (row,) = compare(folder, load(ladder(tmp_path / "a", a, r1)))
    assert row.verdict == "same" and row.change == pytest.approx(0)


def test_references_from_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = ladder(tmp_path, rung(tmp_path, SPEC, 0.1, 0.02, 0))  # ~80 items/s
    ref = tmp_path / "references.yaml"
    cond = "conditions: {device_name: test, data: synthetic}\n"
    ref.write_text(f"{cond}rungs:\n  {SPEC}:\n    items_per_s: [80.0, -0.1, null]\n")
    assert cli(["compare", new, "--reference", str(ref)]) == 0
    assert "within reference" in capsys.readouterr().out
    ref.write_text(f"{cond}rungs:\n  {SPEC}:\n    items_per_s: [100.0, -0.1, null]\n  {OTHER}:\n    items_per_s: [1.0, -0.5, null]\n")
    assert cli(["compare", new, "--reference", str(ref)]) == 1
    out = capsys.readouterr()
    assert "below reference (REGRESSION)" in out.out and f"{OTHER}" in out.err  # absent: fails too
    ref.write_text(f"{cond}rungs:\n  {SPEC}:\n    items_per_s: 80\n")
    assert cli(["compare", new, "--reference", str(ref)]) == 2
    assert f"rungs.{SPEC}.items_per_s: expected [value, lower, upper]" in capsys.readouterr().err


def test_the_local_profiles_references_are_well_formed(tmp_path: Path) -> None:
    from scaleladder.results.compare import check_references

    repo = Path(__file__).resolve().parents[1]
    rows = check_references(str(repo / "profiles" / "local" / "references.yaml"), {})
    assert rows and all(r.verdict == "missing" for r in rows)


def test_bad_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["compare", str(tmp_path / "nope.h5"), str(tmp_path / "nope2.h5")]) == 2
    assert "no such ladder file, rung file or folder" in capsys.readouterr().err
    assert cli(["compare", str(tmp_path)]) == 2
    assert "or NEW with --reference" in capsys.readouterr().err


def test_an_interval_reaching_zero_makes_any_change_within_noise() -> None:
    base = {"status": "ok", "items_per_s": 313.8, "items_per_s_ci_low": 0.0, "items_per_s_ci_high": 689.8}
    new = {"status": "ok", "items_per_s": 250.0, "items_per_s_ci_low": 240.0, "items_per_s_ci_high": 260.0}
    row = judge(SPEC, base, new, 0.05, 0.05)
    assert row.verdict == "same" and "within noise" in row.notes and row.low == -1.0 and math.isinf(row.high)


def test_an_upgrade_is_named_not_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.1, 0.02, 0, torch_version="2.5.1+cu124"))
    new = ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.1, 0.02, 1, torch_version="2.14.1+cu128"))
    assert cli(["compare", base, new, "--figure", str(tmp_path / "c.png")]) == 0
    assert "  changed: torch_version: '2.5.1+cu124' -> '2.14.1+cu128'" in capsys.readouterr().out.splitlines()


def test_compare_uses_the_stored_standard_errors_not_the_width_over_1_96() -> None:
    # three repeats each. Dividing each interval by 2×1.96 overstated the noise by
    # t(2)/1.96 = 2.2×, and this 6% change read as "within noise"; the standard errors with
    # Welch–Satterthwaite's 4 degrees of freedom see it.
    from scaleladder.results.stats import between_runs, t_quantile

    base = {"status": "ok", **between_runs([100.0, 102.0, 98.0])}
    new = {"status": "ok", **between_runs([106.0, 108.0, 104.0])}
    sb, sn = base["items_per_s_se"] / 100.0, new["items_per_s_se"] / 106.0
    dof = (sb**2 + sn**2) ** 2 / (sb**4 / 2 + sn**4 / 2)
    assert 3.9 < dof < 4.0  # rounded down to 3: the safe side
    d, half = math.log(1.06), t_quantile(3) * math.hypot(sb, sn)
    change, low, high = throughput_change(base, new)
    assert change == pytest.approx(0.06) and low == pytest.approx(math.expm1(d - half)) and high == pytest.approx(math.expm1(d + half))
    row = judge(SPEC, base, new, 0.05, 0.05)
    assert row.verdict == "faster", row
    # an older record (interval only) is read through the t its ci_method names
    old = {k: v for k, v in base.items() if k not in ("items_per_s_se", "ci_dof")}
    # (up to the log of a linear interval: within 1% here, where 1.96 would be 2.2× off)
    assert throughput_change(old, new)[1] == pytest.approx(low, rel=0.01)


def test_compare_says_plainly_when_it_judged_on_tolerance_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the default config's rungs: 6 steps, 2 of warm-up, under the 9 an interval needs
    a = ladder(tmp_path / "a", write_rung(tmp_path / "a", SPEC, items_per_s=100.0))
    b = ladder(tmp_path / "b", write_rung(tmp_path / "b", SPEC, items_per_s=101.0))
    assert cli(["compare", a, b, "--figure", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 rung(s) have no 95% interval and were judged on the ±5% tolerance alone" in out


def test_rung_files_anywhere_compare_and_aggregate_by_their_own_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`scaleladder run ... --out r.h5` files: the record's own spec names the rung."""
    a, b = tmp_path / "a" / "r.h5", tmp_path / "b" / "r.h5"
    for src, dst, step in ((tmp_path / "ra", a, 0.100), (tmp_path / "rb", b, 0.125)):
        dst.parent.mkdir()
        rung(src, SPEC, step, 0.02, 0).rename(dst)
    assert cli(["compare", str(a), str(b), "--figure", str(tmp_path / "c.png")]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(SPEC))
    assert "slower (REGRESSION)" in line
    assert cli(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--figure", str(tmp_path / "c.png")]) == 1  # folders too
    capsys.readouterr()
    out = tmp_path / "ladder.h5"
    assert cli(["aggregate", "--out", str(out), str(a)]) == 0
    assert [r["spec"] for r in read_ladder(str(out))[0]] == [SPEC]
    with h5py.File(a, "r+") as f:
        del f.attrs["spec"]
    assert cli(["aggregate", "--out", str(out), str(a)]) == 2
    assert "names no rung" in capsys.readouterr().err


def test_a_change_under_other_conditions_is_never_a_bare_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ladder(tmp_path / "a", rung(tmp_path / "a", SPEC, 0.100, 0.02, 0, steps=42), rung(tmp_path / "a", OTHER, 0.2, 0.02, 1))
    new = ladder(tmp_path / "b", rung(tmp_path / "b", SPEC, 0.125, 0.02, 2, steps=30, flava_impl="tm"),
                 rung(tmp_path / "b", OTHER, 0.2, 0.02, 3))
    assert cli(["compare", base, new, "--figure", str(tmp_path / "c.png")]) == 1
    out = capsys.readouterr()
    line = next(x for x in out.out.splitlines() if x.startswith(SPEC))
    assert "slower (REGRESSION under different conditions: steps 42 -> 30)" in line  # flava_impl: only one side has it
    assert "(REGRESSION)" not in line
    assert "1 of 2 rung(s) were measured under different conditions (steps)" in out.out
    assert "measured under different conditions: steps" in out.err
    other = next(x for x in out.out.splitlines() if x.startswith(OTHER))
    assert "conditions" not in other


def test_a_large_compare_stays_readable_and_its_table_holds_every_rung(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    a, b = [], []
    for i in range(30):  # 30 rungs, each 10-39% slower: every one a regression
        spec = f"vit-debug/ddp/fp32/pre-lag/n1/b{4 + i}"
        a.append(rung(tmp_path / "a", spec, 0.100, 0.01, 2 * i))
        b.append(rung(tmp_path / "b", spec, 0.100 / (1 - (10 + i) / 100), 0.01, 2 * i + 1))
    monkeypatch.chdir(tmp_path)
    table = tmp_path / "out" / "verdicts.csv"
    assert cli(["compare", ladder(tmp_path / "a", *a), ladder(tmp_path / "b", *b), "--table", str(table)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    rows = [x for x in lines if x.startswith("vit-debug/")]
    assert len(rows) == 20 and "30 slower; 30 REGRESSION" in lines[0]
    assert rows[0].startswith("vit-debug/ddp/fp32/pre-lag/n1/b33")  # the largest change first (39%)
    assert any("and 10 more rung(s): every rung in" in x for x in lines)
    assert out.err.count("\n") == 1 and "and 20 more" in out.err  # the regressions' line names 10
    df = pd.read_csv(table)
    assert len(df) == 30 and df["regressed"].all() and pd.api.types.is_numeric_dtype(df["change"])
    assert not list(tmp_path.glob("*.png"))  # no figure unless asked


def test_compare_refuses_an_unknown_table_format_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["compare", str(tmp_path / "nothing-a.h5"), str(tmp_path / "nothing-b.h5"), "--table", str(tmp_path / "t.xlsx")]) == 2
    assert "unknown table format '.xlsx'" in capsys.readouterr().err
