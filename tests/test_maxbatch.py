"""`scaleladder maxbatch`: the search against a fake memory limit, the record, one real run.

A CPU never runs out of memory, so the search logic is tested with an injected probe
(a fake device: batch b needs ``b × per_sample`` bytes; allocator retries near the
limit), and the end-to-end path — probes in fresh processes through
``supervise.launch``, then the full rung, then the record — runs once on vit-debug,
where only ``--max-batch-cap`` can end the search.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from scaleladder.campaign import maxbatch
from scaleladder.campaign.maxbatch import ProbeError, ProbeResult, search
from scaleladder.spec import SpecError


class FakeDevice:
    """Batch b fits when b ≤ limit; within ``retry_band`` of the limit it fits only with retries."""

    def __init__(self, limit: int, retry_band: int = 0):
        self.limit, self.retry_band, self.calls = limit, retry_band, []  # type: list[int]

    def __call__(self, b: int) -> ProbeResult:
        self.calls.append(b)
        if b > self.limit:
            return ProbeResult(b, "oom", reason="CUDA out of memory (fake)")
        retries = 3 if b > self.limit - self.retry_band else 0
        return ProbeResult(b, "ok", alloc_retries=retries, peak_active_gib=b / self.limit * 40)


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 8, 9, 100, 1000])
@pytest.mark.parametrize("start", [None, 1, 5, 64, 5000])
def test_finds_the_exact_limit_from_any_start(limit: int, start: int | None) -> None:
    dev = FakeDevice(limit)
    res = search(dev, start=start)
    assert res.max_batch == limit
    assert len(dev.calls) == len(set(dev.calls)), "a batch was probed twice"
    assert len(dev.calls) <= 2 * (np.log2(max(limit, start or 1)) + 2)  # double, then bisect: logarithmic
    assert [p.batch for p in res.probes] == dev.calls


def test_a_good_start_saves_probes() -> None:
    cold, warm = FakeDevice(300), FakeDevice(300)
    assert search(cold).max_batch == search(warm, start=290).max_batch == 300
    assert len(warm.calls) < len(cold.calls)


def test_allocator_retries_over_the_threshold_fail_the_probe() -> None:
    dev = FakeDevice(100, retry_band=10)  # 91..100 fit only with allocator retries
    res = search(dev)
    assert res.max_batch == 90
    failed = [p for p in res.probes if p.status == "retries"]
    assert failed and all("allocator retries" in p.reason and p.batch > 90 for p in failed)
    assert search(FakeDevice(100, retry_band=10), max_retries=3).max_batch == 100  # the threshold is configurable


def test_batch_one_failing_gives_no_max_batch() -> None:
    res = search(FakeDevice(0), start=8)
    assert res.max_batch is None
    assert [p.batch for p in res.probes] == [8, 4, 2, 1] and all(p.status == "oom" for p in res.probes)


def test_the_cap_ends_a_search_that_never_fails() -> None:
    dev = FakeDevice(10**9)
    res = search(dev, cap=48)
    assert res.max_batch == 48 and res.capped
    assert dev.calls == [1, 2, 4, 8, 16, 32, 48]
    assert search(FakeDevice(10**9), start=500, cap=48).start == 48  # a start above the cap is clamped
    with pytest.raises(SpecError):
        search(FakeDevice(3), cap=0)


def test_a_crashing_probe_aborts_instead_of_counting_as_oom() -> None:
    def probe(b: int) -> ProbeResult:
        return ProbeResult(b, "error", reason="launcher failed with exit code 1")

    with pytest.raises(ProbeError, match="exit code 1"):
        search(probe)


# -- the command, with probes faked at the launcher -------------------------------------------


def _args(tmp_path: Path, spec: str, **extra: Any) -> argparse.Namespace:
    from scaleladder.cli import build_parser

    argv = ["maxbatch", "--spec", spec, "--steps", "3", "--warmup", "1", "--out", str(tmp_path / "r.h5")]
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


def test_nothing_fits_is_an_oom_record_with_its_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaleladder.campaign.supervise as sup

    def fake_launch(cfg: Any, launcher: str) -> int:  # every probe runs out of memory
        sup.write_oom_record(cfg, [{"rank": 0, "step": 1, "error": "CUDA out of memory. Tried to allocate 2 GiB"}], world=1)
        return 0

    monkeypatch.setattr(sup, "launch", fake_launch)
    rc = maxbatch.main(_args(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", plan_device="cpu", ranks_per_node=1))
    assert rc == 0
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["status"] == "oom" and f.attrs["max_batch"] == 0
        assert "batch 1 does not train" in f.attrs["error"]
        assert list(f["maxbatch/probes/batch"][:]) == [1]
        assert list(f["maxbatch/probes/status"].asstr()[:]) == ["oom"]
        assert "Tried to allocate" in f["maxbatch/probes/reason"].asstr()[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]  # probes and work dir removed


def test_predicted_oom_spends_no_probe_unless_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaleladder.campaign.supervise as sup

    calls: list[int] = []

    def fake_launch(cfg: Any, launcher: str) -> int:
        calls.append(int(cfg.spec.batch))
        sup.write_oom_record(cfg, [{"rank": 0, "step": 1, "error": "CUDA out of memory"}], world=8)
        return 0

    monkeypatch.setattr(sup, "launch", fake_launch)
    big = "flava-10b/ddp/bf16-mixed/pre-lag/n1/bmax"  # 225 GiB of state per rank: hopeless on 40 GB
    assert maxbatch.main(_args(tmp_path, big, plan_device="a100-40gb", ranks_per_node=8)) == 0
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["status"] == "predicted-oom" and f.attrs["max_batch"] == 0 and f.attrs["plan_device"] == "a100-40gb"
    assert calls == []
    argv = _args(tmp_path, big, plan_device="a100-40gb", ranks_per_node=8)
    argv.run_predicted_oom = True
    assert maxbatch.main(argv) == 0 and calls == [1]
    assert h5py.File(tmp_path / "r.h5").attrs["status"] == "oom"


@pytest.mark.parametrize("argv,culprit", [
    ({"spec": "vit-debug/single/fp32/pre-lag/n1/b8"}, "bmax"),
    ({"max_retries": "-1"}, "--max-retries"),
    ({"max_batch_cap": "0"}, "max-batch-cap"),
    ({"probe_steps": "2", "probe_warmup": "2"}, "--probe-warmup"),
    ({"plan_device": "tpu", "ranks_per_node": "1"}, "unknown device"),
    ({"plan_device": "a100-40gb"}, "--plan-device needs --ranks-per-node"),
    ({"plan_device": "a100-40gb", "ranks_per_node": "0"}, "ranks-per-node"),
])
def test_bad_input_is_one_line_naming_the_culprit(tmp_path: Path, argv: dict[str, str], culprit: str) -> None:
    spec = argv.pop("spec", "vit-debug/single/fp32/pre-lag/n1/bmax")
    with pytest.raises(SpecError, match=culprit):
        maxbatch.main(_args(tmp_path, spec, **argv))
    assert not (tmp_path / "r.h5").exists()


# -- end to end: real probes in fresh processes ---------------------------------------------------


@pytest.mark.process
@pytest.mark.slow
def test_end_to_end_probes_then_the_rung_then_the_record(tmp_path: Path) -> None:
    # No OOM on a CPU: the cap ends the search (probes b=1, b=2). The probes run the rung's own
    # steps here, so the b=2 probe is the rung (one process start saved: this test's budget).
    rc = maxbatch.main(_args(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", max_batch_cap=2, probe_steps=3,
                             probe_warmup=1, launcher=""))
    assert rc == 0
    with h5py.File(tmp_path / "r.h5") as f:
        a = f.attrs
        assert a["status"] == "ok" and a["spec"] == "vit-debug/single/fp32/pre-lag/n1/bmax"
        assert a["batch"] == "2" and a["max_batch"] == 2 and a["maxbatch_capped"] and a["maxbatch_probes"] == 2
        assert a["steps"] == 3 and a["warmup"] == 1
        probes = f["maxbatch/probes"]
        assert list(probes["batch"][:]) == [1, 2] and list(probes["status"].asstr()[:]) == ["ok", "ok"]
        assert np.all(probes["alloc_retries"][:] == 0) and np.all(probes["seconds"][:] > 0)
        assert f["loss"].shape == (3,)  # the rung's own datasets survive the rewrite
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]


def test_the_rung_runs_separately_when_probes_are_shorter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scaleladder.campaign.supervise as sup
    from scaleladder.results.store import write_record

    runs: list[tuple[str, int]] = []

    def fake_launch(cfg: Any, launcher: str) -> int:  # a device where 6 fits and 7 does not
        runs.append((str(cfg.spec.batch), cfg.steps))
        if int(cfg.spec.batch) > 6:
            sup.write_oom_record(cfg, [{"rank": 0, "step": 1, "error": "CUDA out of memory"}], world=1)
        else:
            write_record(cfg.out, {"status": "ok", **cfg.attrs(), "alloc_retries": 0, "peak_active_gib": 1.0},
                         {"loss": np.zeros(cfg.steps)})
        return 0

    monkeypatch.setattr(sup, "launch", fake_launch)
    rc = maxbatch.main(_args(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", probe_steps=2, probe_warmup=1))
    assert rc == 0
    assert runs[-1] == ("6", 3) and all(steps == 2 for _, steps in runs[:-1])  # probes short, the rung in full
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["max_batch"] == 6 and f.attrs["batch"] == "6" and f["loss"].shape == (3,)
        assert list(f["maxbatch/probes/batch"][:]) == [1, 2, 4, 8, 6, 7]
        assert list(f["maxbatch/probes/status"].asstr()[:]) == ["ok", "ok", "ok", "oom", "ok", "oom"]


def test_probe_result_is_read_from_the_probe_file(tmp_path: Path) -> None:
    from scaleladder.results.store import write_record

    write_record(tmp_path / "p.h5", {"status": "ok", "alloc_retries": 2, "peak_active_gib": 1.5, "peak_reserved_gib": 2.0})
    r = maxbatch.read_probe(tmp_path / "p.h5", 16, 1.0)
    assert (r.status, r.alloc_retries, r.peak_active_gib) == ("ok", 2, 1.5)
    assert maxbatch.judge(r, 1).status == "retries" and maxbatch.judge(r, 2).passed
    write_record(tmp_path / "q.h5", {"status": "oom", "error": "CUDA out of memory"})
    q = maxbatch.read_probe(tmp_path / "q.h5", 32, 1.0)
    assert q.status == "oom" and q.reason == "CUDA out of memory" and not dataclasses.replace(q).passed


def test_a_compiled_rung_starts_at_its_eager_prediction_and_is_never_hopeless() -> None:
    from scaleladder.campaign.maxbatch import planned_start
    from scaleladder.spec import RunSpec

    eager = planned_start(RunSpec.from_path("vit-huge/fsdp2-full/bf16-mixed/pf0/n1/bmax"), "a100-40gb", 8)
    compiled = planned_start(RunSpec.from_path("vit-huge/fsdp2-full-compile/bf16-mixed/pf0/n1/bmax"), "a100-40gb", 8)
    assert compiled == eager and eager[0] is not None
    # where eager cannot fit batch 1, the compiled rung is still probed (compile may save activations)
    assert planned_start(RunSpec.from_path("vit-15b/ddp/bf16-mixed/pre-lag/n1/bmax"), "a100-40gb", 8) == (None, True)
    assert planned_start(RunSpec.from_path("vit-15b/ddp-compile/bf16-mixed/pre-lag/n1/bmax"), "a100-40gb", 8) == (None, False)
