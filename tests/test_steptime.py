"""The step-time model's arithmetic on hand-computed cases: one collective, one FSDP
unit, one DDP bucket; which link a group crosses; the bad inputs (a profile without link
figures, a calibration for another device or torch); and `plan --json` with the figures for
every rung of every profile. Torch-free and cheap: no rung runs."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, in_process
from scaleladder.errors import SpecError
from scaleladder.planner.comm import Link, Links, all_gather_s, all_reduce_s, links_from_profile, reduce_scatter_s
from scaleladder.planner.overlap import Stage, schedule
from scaleladder.planner.rates import HostTable, check_calibration, rates
from scaleladder.planner.steptime import Site, _ddp_stages, host_seconds, predict_step, site_from_config, table_name
from scaleladder.spec import RunSpec, parse_strategy


def test_one_collective() -> None:
    link = Link(10e-6, 1e9)
    # ring all-gather of 1 MB over 4 ranks: 3 alpha + 3/4 of the bytes over beta
    assert all_gather_s(1e6, 4, link) == pytest.approx(3 * 10e-6 + 0.75 * 1e6 / 1e9)  # 780 us
    assert reduce_scatter_s(1e6, 4, link) == pytest.approx(780e-6)
    assert all_gather_s(1e6, 1, link) == 0.0
    # all-reduce of 8 MB over 8 ranks, alpha 5 us, 10 GB/s: ring 70 us + 1.4 ms, tree 30 us + 1.6 ms -> ring
    fast = Link(5e-6, 1e10)
    assert all_reduce_s(8e6, 8, fast) == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * 8e6 / 1e10)
    # tiny message, high latency: the tree's 2 log2(n) latency terms win
    slow = Link(1e-3, 1e10)
    assert all_reduce_s(8.0, 8, slow) == pytest.approx(2 * 3 * 1e-3 + 2 * 8.0 / 1e10)


def test_one_fsdp_unit() -> None:
    # forward: gather 0.2 then compute 1.0; backward: regather (prefetched behind the forward's
    # compute), compute 2.0, reduce 0.4 -> 0.2 + 1.0 + 2.0 + 0.4; exposed: first gather + reduce
    s = schedule([Stage(1.0, 0.2), Stage(2.0, 0.2, 0.4)])
    assert (s.total_s, s.compute_s, s.comm_s) == pytest.approx((3.6, 3.0, 0.8))
    assert s.exposed_s == pytest.approx(0.6)
    # gathers longer than compute: 0..0.5 gather, 0.5..0.6 compute, 0.5..1.0 regather, 1.0..1.2, reduce to 1.6
    s = schedule([Stage(0.1, 0.5), Stage(0.2, 0.5, 0.4)])
    assert (s.total_s, s.exposed_s) == pytest.approx((1.6, 1.3))
    # no prefetch (depth 0): the regather waits for the forward's compute to end: nothing changes here,
    # but with two forward units the second gather no longer hides behind the first compute
    hidden = schedule([Stage(1.0, 0.3), Stage(1.0, 0.3)])
    waits = schedule([Stage(1.0, 0.3, depth=0), Stage(1.0, 0.3, depth=0)])
    assert (hidden.total_s, waits.total_s) == pytest.approx((2.3, 2.6))


def test_one_fsdp_unit_from_its_sizes() -> None:
    """vit-debug FULL_SHARD on 2 ranks, fp32: a layer unit's gather moves (2-1)/2 of its flat
    parameter (4 B each), its reduce-scatter the same of its gradient; the backward regathers."""
    from scaleladder.planner.step_setup import step_setup
    from scaleladder.planner.steptime import _fsdp_stages

    spec = RunSpec.from_path("vit-debug/fsdp-full/fp32/pre-lag/n1/b1")
    setup = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, 2)
    link = Link(0.0, 1e9)
    stages = _fsdp_stages(setup, Links(link, link), 2, 1.0, 2.0)
    gather = 0.5 * setup.unit_full["layer"] * 4 / 1e9
    layers = [st for st in stages if st.compute_s > 0]
    assert len(layers) == 2 * 2  # vit-debug: 2 layers, forward and backward
    assert [st.before_s for st in layers] == pytest.approx([gather] * 4)
    assert [st.after_s for st in layers[2:]] == pytest.approx([0.5 * setup.grad_full["layer"] * 4 / 1e9] * 2)
    assert sum(st.compute_s for st in layers) == pytest.approx(3.0)


def test_one_ddp_bucket() -> None:
    # 1,000 fp32 gradients = 4,000 bytes: one bucket (under DDP's 1 MiB first bucket), all-reduced over
    # 2 ranks once the backward (2 s) ends: ring 2 alpha + S/beta = 20 us + 4 us, all of it exposed
    links = Links(Link(1e-5, 1e9), Link(1e-4, 1e8))
    stages = _ddp_stages(1000, 4, 2, links, 2, 1.0, 2.0)
    assert len(stages) == 2 and stages[1].after_s == pytest.approx(2.4e-5)
    s = schedule(stages)
    assert (s.total_s, s.exposed_s) == pytest.approx((3.0 + 2.4e-5, 2.4e-5))
    # 60 MiB of gradients: a 1 MiB bucket, two of 25 MiB and the 9 MiB rest; all but the last hide
    sizes = [st.after_s for st in _ddp_stages(60 * 2**20 // 4, 4, 2, Links(Link(0, 1e9), Link(0, 1e9)), 2, 0.0, 10.0)[1:]]
    assert sizes == pytest.approx([b / 1e9 for b in (2**20, 25 * 2**20, 25 * 2**20, 9 * 2**20)])


def test_link_of_a_group() -> None:
    pair, node, inter = Link(1e-5, 200e9), Link(1e-5, 50e9), Link(2e-5, 100e9)
    links = Links(node, inter, pair, 2)
    assert links.for_group(2, 1, 8) is pair  # the 2 GCDs of one MI250X
    assert links.for_group(8, 1, 8) is node  # a ring over the node: its slowest hop
    assert links.for_group(16, 1, 8).beta_bps == pytest.approx(100e9 / 8)  # 8 ranks share the node's NICs
    # HYBRID's replicate group has 1 rank per node, but the node's 8 replicate groups all-reduce
    # at once: each rank still gets an eighth of the node's NICs (the whole node was 8x optimistic)
    assert links.for_group(2, 8, 8).beta_bps == pytest.approx(100e9 / 8)
    assert links.for_group(8, 2, 8).beta_bps == pytest.approx(100e9 / 8)  # hybrid2 on 2 nodes: 2 replicate groups of 8


def test_profile_without_links_falls_back_and_says_so() -> None:
    site = site_from_config({"timing": {"links": {"intra_node": {"alpha_us": 5, "gbps": 10}}}}, "p")
    assert site.links is None and site.links_note == "profile p: no timing.links.inter_node"
    spec = RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n2/b32")
    st = predict_step(spec, 16, 8, 32, rates("a100-40gb", "bf16-mixed"), site)
    assert st.comm_s == 0 and any("no timing.links.inter_node" in s and "compute + host" in s for s in st.sources)
    assert links_from_profile(None)[1] == "no links (links.intra_node, links.inter_node)"


def test_calibration_for_another_device_or_torch_is_refused() -> None:
    cal = {"device": "h100-80gb", "torch": "2.11", "compute": {}, "host": {"us_per_op": 1}}
    check_calibration(cal, "h100-80gb", "2.11.0+cu130", "h100.json")
    with pytest.raises(SpecError, match=r"is for h100-80gb under torch 2.11, not mi250x-gcd"):
        check_calibration(cal, "mi250x-gcd", None, "h100.json")
    with pytest.raises(SpecError, match=r"not h100-80gb under torch 2.14"):
        check_calibration(cal, "h100-80gb", "2.14.1", "h100.json")


def test_calibration_reproduces_its_own_rung() -> None:
    """h100.json was solved from vit-base single b128 (48.8 ms, compute) and flava-350m single b16
    (196.2 ms, host-bound: its table_factor over the host table of the tree the H100 ran, under
    TorchMultimodal's FLAVA): it must give both back."""
    from scaleladder.planner.rates import read_host_table

    r = rates("h100-80gb", "bf16-mixed")
    st = predict_step(RunSpec.from_path("vit-base/single/bf16-mixed/pre-lag/n1/b128"), 1, 1, 128, r)
    assert st.step_time_s == pytest.approx(48.8e-3, rel=0.005) and st.bound == "gpu"
    tree = read_host_table(REPO / "src/scaleladder/planner/calibration/host_table_75af641.json")
    st = predict_step(RunSpec.from_path("flava-350m/single/bf16-mixed/pre-lag/n1/b16"), 1, 1, 16, r,
                      flava_impl="torchmultimodal", table=tree)
    assert st.step_time_s == pytest.approx(196.2e-3, rel=0.005) and st.bound == "host"


def test_wide_debug_flavor_is_communication_bound_on_the_ci_cluster() -> None:
    """vit-debug-wide exists for 4(b): with the CI cluster's measured links and the calibration
    solved from its one-rank rung (which it gives back), the 2-node rungs must be predicted to
    spend at least 30% of the step communicating, or part (b) tests nothing."""
    from scaleladder.planner.rates import read_calibration
    from scaleladder.site.profiles import load_profile

    cal = read_calibration(REPO / "src/scaleladder/planner/calibration/cpu_wide.json")
    check_calibration(cal, "cpu", "2.14.1", "cpu_wide.json")
    r = rates("cpu", "fp32", cal, "cpu_wide.json")
    one = predict_step(RunSpec.from_path("vit-debug-wide/single/fp32/pre-lag/n1/b1"), 1, 1, 1, r)
    assert one.step_time_s * 1e3 == pytest.approx(float(cal["compute"]["fp32"]["from"].split(": ")[1].split()[0]), rel=0.005)
    site = site_from_config(load_profile("slurm-localhost", REPO).config, "slurm-localhost")
    for s in ("ddp", "fsdp-full", "fsdp-hybrid2"):
        st = predict_step(RunSpec.from_path(f"vit-debug-wide/{s}/fp32/pre-lag/n2/b1"), 4, 2, 1, r, site)
        assert st.comm_s >= 0.3 * st.step_time_s, s


# Every planner device's step-time figures where nothing is measured: (fp32, tf32, bf16 = fp16
# TFLOP/s, HBM GB/s), the datasheets' (the CPU's stated). The device table holds them once.
STEP_FIGURES = {
    "a100-40gb": (19.5, 156.0, 312.0, 1555), "a100-80gb": (19.5, 156.0, 312.0, 2039),
    "h100-80gb": (67.0, 494.5, 989.0, 3350), "h200-141gb": (67.0, 494.5, 989.0, 4800),
    "mi250x-gcd": (47.85, 47.85, 191.5, 1638), "cpu": (0.1, 0.1, 0.1, 20),
}


def test_every_planner_device_has_its_datasheet_figures() -> None:
    from scaleladder.planner.devices import DEVICES

    assert list(DEVICES)[:len(STEP_FIGURES)] == list(STEP_FIGURES)
    for device, (fp32, tf32, bf16, hbm) in STEP_FIGURES.items():
        for precision, tflops in (("fp32", fp32), ("tf32", tf32), ("bf16-mixed", bf16), ("bf16-true", bf16), ("fp16-mixed", bf16)):
            r = rates(device, precision, calibration={"compute": {}, "host": {"us_per_op": 1.0}}, where="x")
            assert r.peak_flops == tflops * 1e12 and r.hbm_bps == hbm * 1e9 * 0.8, (device, precision)
            assert (r.ceiling, r.h_half) == (0.8, 1394.6) and r.compute_source.startswith("datasheet peak x stated efficiency")
    with pytest.raises(SpecError, match=r"no datasheet figures for device 'b9000' \(planner/devices.py: a100-40gb, "):
        rates("b9000", "fp32")


def test_every_rung_of_every_profile_has_a_step_time() -> None:
    """-compile rungs included (their memory the eager rung's, an upper bound); on a GPU site every
    rung's host work comes from the measured host table, never the stated per-op fallback."""
    from scaleladder.planner.memory import predict
    from scaleladder.site.ladder import rank_args
    from scaleladder.site.plan_time import Timing, memory_model, step_fields
    from scaleladder.site.profiles import load_profile

    compiled = 0
    for name in sorted(p.name for p in (REPO / "profiles").iterdir() if (p / "site.yaml").is_file()):
        prof = load_profile(name, REPO)
        timing = Timing(site_from_config(prof.config, name), None, "")
        device = prof.site.get("plan_device") or "cpu"
        for spec in prof.ladder.rungs:
            world, rpn = rank_args(spec, prof.ladder.ranks_per_node)
            f = step_fields(spec, world, rpn, spec.batch if isinstance(spec.batch, int) else 1, device, timing)
            assert f["step_time_s"] and math.isfinite(f["step_time_s"]), (name, spec.path, f)
            assert set(f["step_time_parts"]) == {"compute_s", "host_s", "comm_s", "exposed_comm_s"}
            host = next(s for s in f["step_time_sources"] if s.startswith("host:"))
            assert device == "cpu" or "STATED" not in host, (name, spec.path, host)
            if spec.strategy.compile:
                compiled += 1
                assert predict(spec, world, rpn, device).peak_bytes > 0 and memory_model(spec).startswith("upper bound")
    assert compiled >= 10


def _table(*rows: tuple[str, str, str, float]) -> HostTable:
    return HostTable.from_json({"rows": [{"model": m, "strategy": s, "flava_impl": i, "host_ms": ms, "aten_ops": 1,
                                          "tree": "t"} for m, s, i, ms in rows]}, "t.json")


def test_host_work_from_the_table_found_or_composed() -> None:
    """A rung's own row; else its model's `single` (or the family's model nearest in depth, scaled
    by depth) x the family's median ratio; a strategy no model measured composed from its measured
    parts (wrapper x AC x compile); -sac and FLAVA's two implementations each their own rows;
    nothing to compose from: None (the stated fallback)."""
    t = _table(("vit-base", "single", "", 100), ("vit-base", "fsdp-full", "", 160), ("vit-base", "single-ac", "", 150),
               ("vit-base", "single-sac", "", 120), ("vit-base", "single-compile", "", 80),
               ("vit-huge", "single", "", 300), ("vit-huge", "fsdp-full", "", 420), ("vit-1b", "single", "", 200),
               ("flava-350m", "single", "sdpa", 400), ("flava-350m", "single", "torchmultimodal", 500))
    assert t.host_ms("vit-base", "vit", "fsdp-full", "")[0] == 160  # its own row
    assert t.host_ms("vit-1b", "vit", "fsdp-full", "")[0] == pytest.approx(200 * 1.5)  # median of 1.6 and 1.4
    assert t.host_ms("vit-huge", "vit", "single-sac", "")[0] == pytest.approx(300 * 1.2)  # not -ac's 1.5
    assert t.host_ms("vit-huge", "vit", "fsdp-full-ac", "")[0] == pytest.approx(300 * 1.5 * 1.5)
    assert t.host_ms("vit-huge", "vit", "fsdp-full-ac-compile", "")[0] == pytest.approx(300 * 1.5 * 1.5 * 0.8)
    assert t.host_ms("vit-huge", "vit", "fsdp2-full", "") is None  # no model measured FSDP2
    assert t.host_ms("vit-debug", "vit", "single", "") is None  # a debug flavor: no real flavor's depth to scale
    # a model without a row: the family's model nearest in depth (vit-1b's 32 layers), scaled by depth
    assert t.host_ms("vit-5b", "vit", "fsdp-full", "")[0] == pytest.approx(200 * 56 / 32 * 1.5)
    assert [t.host_ms("flava-350m", "flava", "single", i)[0] for i in ("sdpa", "torchmultimodal")] == [400, 500]
    # the step: the row x the calibration host's table factor x the site's cpu factor; else STATED, said
    r = dataclasses.replace(rates("h100-80gb", "bf16-mixed"), table_factor=0.5)
    spec = RunSpec.from_path("vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b8")
    host, src = host_seconds(spec, r, Site(cpu_factor=1.3), table=t)
    assert host == pytest.approx(0.160 * 0.5 * 1.3) and "vit-base/fsdp-full measured" in src
    host, src = host_seconds(RunSpec.from_path("vit-base/fsdp2-full/bf16-mixed/pf0/n1/b8"), r, Site(), table=t)
    assert "STATED" in src and "t.json has no vit-base/fsdp2-full" in src
    assert table_name(parse_strategy("fsdp-hybrid2-ac-reentrant")) == ("fsdp-full-ac", "; fsdp-hybrid2-ac-reentrant as fsdp-full-ac")
    assert table_name(parse_strategy("fsdp2-full-sac-compile"))[0] == "fsdp2-full-sac-compile"


def test_plan_json_text_and_fits_table_carry_the_step_time() -> None:
    def plan(*args: str) -> str:
        p = in_process("plan", *args, cwd=REPO)
        assert p.returncode == 0, p.stderr
        return p.stdout

    d = json.loads(plan("--spec", "vit-huge/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32", "--profile", "frontier", "--json"))
    assert d["step_time_s"] > 0 and d["step_time_parts"]["comm_s"] > 0
    text = plan("--spec", "vit-base/ddp/bf16-mixed/pre-lag/n1/b32", "--profile", "local", "--device", "a100-40gb")
    assert "step time:" in text and "no timing.links" in text
    table = plan("--fits-table", "--device", "a100-40gb", "--profile", "a100", "--batch", "8")
    assert " ms" in table and "predicted step time" in table


def test_time_chart_before_any_run(tmp_path: Path) -> None:
    """`plan --time-chart OUT --profile P`: items/s and memory per GPU against nodes for every
    strategy of the ladder (the CI profile: debug flavors, cheap); a bad suffix exits 2."""
    run = ["plan", "--profile", "slurm-localhost", "--device", "cpu"]
    out = in_process(*run, "--time-chart", str(tmp_path / "t.png"), "--json", cwd=REPO)
    assert out.returncode == 0, out.stderr
    pts = json.loads(out.stdout)
    assert (tmp_path / "t.png").stat().st_size > 10_000
    assert {p["strategy"] for p in pts} >= {"ddp", "fsdp-full"} and {p["nodes"] for p in pts} == {1, 2}
    assert all(p["items_per_s"] > 0 for p in pts if p["fits"])
    bad = in_process(*run, "--time-chart", str(tmp_path / "t.txt"), cwd=REPO)
    assert bad.returncode == 2 and "--time-chart" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.process
@pytest.mark.parametrize("content", [None, "{not json", '{"device": "h100-80gb", "torch": "2.11", "compute": {}, "host": {}}'])
def test_two_node_table_refuses_a_bad_cpu_calibration_in_one_line(tmp_path: Path, content: str | None) -> None:
    """benchmarks/steptime_two_nodes.py --cpu-calibration: a missing file, bad JSON or another
    device's calibration is one line naming the file, exit 2, before any record is read."""
    cal = tmp_path / "cal.json"
    if content is not None:
        cal.write_text(content)
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/steptime_two_nodes.py"), "--bench", str(tmp_path),
                          "--records", str(tmp_path), "--cpu-calibration", str(cal)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cpu-calibration" in lines[0] and str(cal) in lines[0], out.stderr
