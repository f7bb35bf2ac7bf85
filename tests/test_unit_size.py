"""FSDP's unit size as an axis of the ladder: k consecutive blocks of a stack per FSDP2 unit
(knobs ``-u<k>``; the grammar and its refusals are tests/test_spec.py's).

In one process (a one-rank gloo group): the units are built per stack with the remainder in the
last unit, the ladder's check counts units of k (what_ran), the losses are the single process's,
the refusals are one line; the planner follows the units (their gathers, reduces and host work)
and is held to torch's tracker at k = 2 and 4 (vit-base, fake tensors, worlds 1 and 2). On two
gloo ranks (process): the losses of sharded units of k against the single process's.
docs/strategies.md, "Units of k blocks"; docs/performance.md, "Units of k layers".
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from types import MappingProxyType

import numpy as np
import pytest
import torch

from helpers.gloo import one_rank_group
from scaleladder import flavors
from scaleladder.flavors import get_flavor, register
from scaleladder.spec import RunSpec, SpecError, default_knobs, parse_knobs, parse_strategy

CPU = torch.device("cpu")
VIT5 = "vit-debug-5"  # a ViT of 5 blocks: units of 2 are 2, 2, 1
FLAVA_DEEP = "flava-debug-deep"  # FLAVA with stacks of 5, 5 and 2: units of 2 are 3, 3 and 1 units


@pytest.fixture
def deep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two deeper debug flavors, registered for the test only (the table is restored after)."""
    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))
    register(dataclasses.replace(get_flavor("vit-debug"), name=VIT5, layers=5))
    register(dataclasses.replace(get_flavor("flava-debug"), name=FLAVA_DEEP, layers=5, mm_layers=2))
    yield


def _wrap(flavor: str, strategy: str, knobs: str | None = None, backend: str = "aot_eager") -> tuple[torch.nn.Module, object]:
    from scaleladder.models.build import build_model
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy

    torch.manual_seed(0)
    s = parse_strategy(strategy)
    return apply_strategy(build_model(get_flavor(flavor)), s, parse_knobs(knobs) if knobs else default_knobs(s),
                          policy("fp32"), CPU, compile_backend=backend)


def _losses(flavor: str, strategy: str, knobs: str | None, batch: int, steps: int = 3) -> list[float]:
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.loop import train_loop
    from scaleladder.rung.precision import policy

    wrapped, _ = _wrap(flavor, strategy, knobs)
    opt = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-3)
    m = train_loop(wrapped, opt, SyntheticBatches(get_flavor(flavor), batch, 0, steps, 0, CPU), steps=steps, warmup=0,
                   prec=policy("fp32"), device=CPU, compiled=False)
    return [float(x) for x in m.loss]


# -- the runner: units, the wrap check, parity, refusals ---------------------------------------


@pytest.mark.parametrize("flavor,knobs,sizes", [
    ("vit-debug", "pf0-u2", [2]),
    (VIT5, "pf0-u2", [2, 2, 1]),  # the last unit of a stack holds the remainder
    (VIT5, "pf1-u3", [3, 2]),
    (VIT5, "pf0-u5", [5]),
    (FLAVA_DEEP, "pf0-u2", [2, 2, 1, 2, 2, 1, 2]),  # image, text, multimodal: never across stacks
])
@pytest.mark.parametrize("strategy", ["fsdp2-full", "fsdp2-grad-op-ac", "fsdp2-full-sac-compile"])
def test_units_of_k_blocks_per_stack_are_counted(deep: None, flavor: str, knobs: str, sizes: list[int], strategy: str) -> None:
    from scaleladder.rung.what_ran import count_fsdp_units, fsdp_layer_unit_sizes

    if "compile" in strategy and flavor.startswith("flava"):
        pytest.skip("FLAVA's compiled blocks: one graph per encoder costs seconds; ViT's carry the case")
    with one_rank_group():
        wrapped, report = _wrap(flavor, strategy, knobs)
        blocks = tuple(wrapped.layer_cls if isinstance(wrapped.layer_cls, tuple) else (wrapped.layer_cls,))  # type: ignore[union-attr]
        assert fsdp_layer_unit_sizes(wrapped, blocks) == sizes
        extra = 2 if flavor.startswith("flava") else 1  # the root (and FLAVA's codebook)
        assert report.fsdp_layer_units == len(sizes) and report.fsdp_units == len(sizes) + extra  # type: ignore[attr-defined]
        assert count_fsdp_units(wrapped) == report.fsdp_units  # type: ignore[attr-defined]


def test_a_unit_per_block_is_the_seeds_wrapping(deep: None) -> None:
    """k = 1: the knobs leave the unit structure, the counts and the record as they were."""
    with one_rank_group():
        _, one = _wrap(VIT5, "fsdp2-full", "pf1")
        assert (one.fsdp_layer_units, one.fsdp_units) == (5, 6)  # type: ignore[attr-defined]
    assert RunSpec.from_path("vit-base/fsdp2-full/fp32/pf1/n1/b8").knobs == parse_knobs("pf1")


def test_explicit_prefetch_counts_units_within_a_stack(deep: None) -> None:
    """pf1 over units of 2 (2, 2, 1 blocks): each unit names the next UNIT ahead and the previous behind."""
    with one_rank_group():
        wrapped, _ = _wrap(VIT5, "fsdp2-full", "pf1-u2")
        states = []
        for m in wrapped.modules():
            if isinstance(m, wrapped.layer_cls):  # type: ignore[arg-type]
                s = m._get_fsdp_state()  # type: ignore[operator]
                if s not in states:
                    states.append(s)
        assert len(states) == 3
        assert [len(s._states_to_forward_prefetch) for s in states] == [1, 1, 0]
        assert states[0]._states_to_forward_prefetch == [states[1]] and states[2]._states_to_backward_prefetch == [states[1]]


@pytest.mark.parametrize("flavor,strategies,batch,steps", [
    (VIT5, [("fsdp2-full", "pf0-u2"), ("fsdp2-grad-op-ac", "pf1-u3"), ("fsdp2-full-sac", "pf2-u2")], 4, 3),
    (FLAVA_DEEP, [("fsdp2-full-ac", "pf1-u2")], 10, 2),  # FLAVA's three stacks, each in units of 2
])
def test_units_of_k_train_as_the_single_process(deep: None, flavor: str, strategies: list[tuple[str, str]], batch: int,
                                                steps: int) -> None:
    """One rank: the same losses as `single` at RTOL (tests/test_parity.py's; k = 1 is held there)."""
    with one_rank_group():
        ref = np.array(_losses(flavor, "single", None, batch, steps))
        assert not np.allclose(ref, ref[0])
        for strategy, knobs in strategies:
            np.testing.assert_allclose(_losses(flavor, strategy, knobs, batch, steps), ref, rtol=1e-5, err_msg=strategy)


def test_meta_init_materialises_each_unit_of_k(deep: None, tmp_path: object) -> None:
    """--init meta: each block of a unit materialised before its fully_shard, none left on meta."""
    import argparse

    from scaleladder.rung.precision import policy
    from scaleladder.rung.run import build_wrapped
    from scaleladder.rung.run_config import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--spec", f"{VIT5}/fsdp2-full/fp32/pf0-u2/n1/b4", "--out", f"{tmp_path}/r.h5",
                                         "--init", "meta"]))
    with one_rank_group():
        wrapped, report, _ = build_wrapped(cfg, "meta", CPU, policy("fp32"))
    assert not any(p.is_meta for p in wrapped.parameters()) and report.fsdp_layer_units == 3


@pytest.mark.parametrize("flavor,strategy,knobs,culprit", [
    ("flava-debug", "fsdp2-full", "pf0-u2", r"a unit of 2 blocks is larger than a stack of flava-debug \(stacks of 2, 2, 1"),
    ("vit-debug", "fsdp2-full-ac", "pf1-u3", r"a unit of 3 blocks is larger than a stack of vit-debug \(stacks of 2 blocks\)"),
    ("vit-debug", "fsdp-full", "pre-lag-u2", "FSDP1 .* cannot put 2 blocks in one unit: it has no list API"),
    ("vit-debug", "ddp", "pre-lag-u2", "'ddp' is not FSDP"),
])
def test_the_runner_refuses_units_it_cannot_build_in_one_line(flavor: str, strategy: str, knobs: str, culprit: str) -> None:
    with one_rank_group(), pytest.raises(SpecError, match=culprit) as e:
        _wrap(flavor, strategy, knobs)
    assert "\n" not in str(e.value)


def test_a_wrap_that_misses_a_unit_of_k_is_an_error(deep: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check counts units of k: a grouping that wraps the blocks one by one fails it."""
    from scaleladder.rung import parallelize

    monkeypatch.setattr(parallelize, "unit_groups", lambda stacks, k: [[b] for s in stacks for b in s])
    with one_rank_group(), pytest.raises(SpecError, match=r"units of 2 blocks hold \[1, 1, 1, 1, 1\]"):
        _wrap(VIT5, "fsdp2-full", "pf0-u2")


# -- the planner --------------------------------------------------------------------------------


def test_the_planner_counts_units_of_k_per_stack() -> None:
    from scaleladder.planner.inventory import layer_units
    from scaleladder.planner.step_setup import step_setup

    assert layer_units(get_flavor("vit-base"), parse_knobs("pf0-u5")) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    flava = layer_units(get_flavor("flava-350m"), parse_knobs("pf0-u4"))
    assert [len(u) for u in flava] == [4, 4, 4, 4, 4, 4, 4, 2] and flava[3] == [12, 13, 14, 15]  # 12, 12, 6
    with pytest.raises(SpecError, match="larger than a stack of flava-350m"):
        layer_units(get_flavor("flava-350m"), parse_knobs("pf0-u7"))
    spec = RunSpec.from_path("vit-base/fsdp2-full/bf16-mixed/pf0-u4/n1/b8")
    setup = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, 2)
    assert setup.unit_layers == {0: 4, 1: 4, 2: 4}
    assert [c.unit for c in setup.backward if c.is_layer] == [2] * 4 + [1] * 4 + [0] * 4
    with pytest.raises(SpecError, match="FSDP1"):
        step_setup("vit-base", parse_strategy("fsdp-full"), "fp32", parse_knobs("pre-lag-u2"), 2)


def test_a_units_gather_holds_k_layers_in_the_plan() -> None:
    """Larger units: more gathered at once (peak up), the same bytes stored (static the same),
    fewer collectives of k layers each (the same bytes moved), and less host work."""
    from scaleladder.planner.comm import links_from_profile
    from scaleladder.planner.memory import predict
    from scaleladder.planner.rates import rates
    from scaleladder.planner.static import static_bytes_per_rank
    from scaleladder.planner.steptime import Site, predict_step

    def spec(knobs: str) -> RunSpec:
        return RunSpec.from_path(f"vit-base/fsdp2-full/bf16-mixed/{knobs}/n1/b8")

    peaks = [predict(spec(k), 8, 8, "h100-80gb").peak_bytes for k in ("pf0", "pf0-u2", "pf0-u4")]
    assert peaks[0] < peaks[1] < peaks[2]
    assert static_bytes_per_rank(spec("pf0-u4"), 8) == static_bytes_per_rank(spec("pf0"), 8)
    links, _ = links_from_profile({"intra_node": {"alpha_us": 8, "gbps": 300}, "inter_node": {"alpha_us": 15, "gbps": 200}})
    r = rates("h100-80gb", "bf16-mixed")
    one, four = (predict_step(spec(k), 8, 8, 8, r, Site(links=links)) for k in ("pf0", "pf0-u4"))
    assert four.host_s < one.host_s and four.comm_s == pytest.approx(one.comm_s, rel=0.02)
    assert any("units of 4 layers: 3 layer units for 12" in s for s in four.sources)


# Measured on dev-cpu: +0.7% (k=2, world 1), +1.8% (k=4, world 2), +1.0% (k=4 under AC, world 2).
TRACKED = [("vit-base/fsdp2-full/bf16-mixed/pf0-u2/n1/b8", 1), ("vit-base/fsdp2-full/bf16-mixed/pf0-u4/n1/b8", 2),
           ("vit-base/fsdp2-full-ac/bf16-mixed/pf0-u4/n1/b32", 2)]


@pytest.mark.parametrize("spec,world", TRACKED)
def test_the_planner_agrees_with_torchs_tracker_on_units_of_k(spec: str, world: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within 5% (tests/test_plan_check.py's tolerance), with torch's FSDP2 tracker made to keep a
    grouped unit's hooks (campaign/unit_tracker.py says why the stock one cannot measure it)."""
    import scaleladder.campaign.plan_check as pc
    from scaleladder.campaign.unit_tracker import fsdp2_tracker

    real = pc._tracker
    monkeypatch.setattr(pc, "_tracker", lambda w, o, s: fsdp2_tracker(w, o) if s.strategy.is_fsdp2 else real(w, o, s))
    c = pc.measure(RunSpec.from_path(spec), world)
    assert abs(c.error) <= 0.05, "\n".join(c.lines())
    params = c.static("params")
    assert params[0] == params[1] > 0


# -- two ranks ----------------------------------------------------------------------------------


@pytest.mark.process
def test_sharded_units_of_k_reproduce_the_single_process_loss() -> None:
    """vit-debug on 2 gloo ranks, its 2 blocks one unit: sharded, gathered and reduced as one, with
    and without AC, and under HSDP, against the single process (helpers/parity_worker.py)."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).parent

    def run(nproc: int, names: list[str]) -> dict[str, list[float]]:
        import json

        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                              str(here / "helpers" / "parity_worker.py"), "vit-debug", "8", "4", ",".join(names)],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return dict(json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("PARITY "))[len("PARITY "):]))

    ref = np.array(run(1, ["single"])["single"])
    got = run(2, ["fsdp2-full:pf0-u2", "fsdp2-full-ac:pf1-u2", "fsdp2-grad-op:pf0-u2", "fsdp2-hybrid1:pf0-u2"])
    for name, losses in got.items():
        np.testing.assert_allclose(losses, ref, rtol=1e-5, err_msg=name)
