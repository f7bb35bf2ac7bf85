"""The timed loop's definitions that a CPU can check: memory counters counted within the
window only, and what counts as running out of memory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from helpers.gloo import one_rank_group
from scaleladder.campaign.maxbatch import is_oom_message
from scaleladder.results.record import Host, checked
from scaleladder.rung import loop
from scaleladder.rung.loop import OOMDuringStep, is_oom, oom_line, train_loop
from scaleladder.rung.precision import policy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

CPU = torch.device("cpu")


class Counting(nn.Module):
    """A model whose every forward 'retries an allocation' once (and every 3rd 'OOMs'),
    the way a GPU's cumulative counters grow from process start."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.calls = 0

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        self.calls += 1
        return (self.w * batch["x"]).sum()


@pytest.mark.parametrize("steps,warmup", [(7, 3), (5, 0), (4, 1)])
def test_alloc_retries_and_ooms_count_the_window_only(monkeypatch: pytest.MonkeyPatch, steps: int, warmup: int) -> None:
    model = Counting()
    # num_alloc_retries / num_ooms never reset (reset_peak_memory_stats leaves them): fake
    # counters that have already counted 100 / 10 before this loop, then grow per step.
    monkeypatch.setattr(loop, "_mem_counters", lambda device: (100 + model.calls, 10 + model.calls // 3))
    batches = [{"x": torch.ones(2)}] * steps
    with one_rank_group():
        m = train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, steps=steps, warmup=warmup, prec=policy("fp32"), device=CPU)
    assert m.alloc_retries.tolist() == [steps - warmup]  # the warm-up's and the process's earlier ones excluded
    assert m.ooms.tolist() == [steps // 3 - warmup // 3]
    assert m.measured_steps == steps - warmup and len(m.step_time_s) == steps


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"),
        # NCCL's and RCCL's own reports, as torch's DistBackendError carries them: the
        # memory line is the LAST of four, "Cuda"/"HIP" in their own case
        dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"]),
        dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"].replace("failure 2 ", "failure ")),  # NCCL < 2.19
        dist.DistBackendError(loop.INJECTED_MESSAGES["rccl"]),
        RuntimeError("HIP error: hipErrorOutOfMemory"),
    ],
    ids=["torch-oom", "cublas", "hipblas", "cuda-runtime", "hip", "nccl", "nccl-old", "rccl", "hip-name"],
)
def test_every_way_a_gpu_runs_out_of_memory_is_an_oom(exc: BaseException) -> None:
    assert is_oom(exc)
    # the record keeps the line that says so, which maxbatch must recognise in turn
    assert is_oom_message(oom_line(exc)) and "\n" not in oom_line(exc)


def test_the_nccl_oom_is_named_by_its_memory_line_not_its_first() -> None:
    e = dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"])
    assert oom_line(e) == "Cuda failure 2 'out of memory'"
    assert not is_oom_message(str(e).splitlines()[0])  # why the first line would not do


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("CUDA error: an illegal memory access was encountered"), ValueError("out of memory"),
     RuntimeError("Expected all tensors to be on the same device"),
     dist.DistBackendError(loop.INJECTED_MESSAGES["nccl"].replace("'out of memory'", "'invalid argument'")),
     RuntimeError("No backend type associated with device type cpu")],
)
def test_other_failures_are_not_ooms(exc: BaseException) -> None:
    assert not is_oom(exc)


def test_a_cublas_alloc_failure_in_a_step_carries_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALELADDER_INJECT_OOM", "0:2:cublas")
    model = Counting()
    with one_rank_group(), pytest.raises(OOMDuringStep) as e:
        train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), [{"x": torch.ones(2)}] * 4, steps=4, warmup=1, prec=policy("fp32"), device=CPU)
    assert e.value.step == 2 and "CUBLAS_STATUS_ALLOC_FAILED" in str(e.value)


# -- host-boundness (docs/metrics.md, "Host-boundness") and benchmarks/bench_host.py ------------


class _FakeDevice:
    """A device that runs each step's kernels for ``busy`` seconds, starting each no sooner
    than the host issued it and the previous step ended; events read its clock."""

    def __init__(self, host: list[float], busy: float) -> None:
        self.host, self.busy, self.free = host, busy, 0.0

    def event(self) -> object:
        device = self

        class Event:
            t = 0.0

            def record(self) -> None:  # the step before ends, then this event passes
                self.t = device.free = max(device.host[0], device.free)

            def elapsed_time(self, other: Event) -> float:
                return (other.t - self.t) * 1e3  # ms, as torch.cuda.Event's

        return Event()


@pytest.mark.parametrize("issue,busy,bound", [(0.010, 0.004, True), (0.002, 0.010, False)], ids=["host-bound", "device-bound"])
def test_host_boundness_from_an_injected_clock(monkeypatch: pytest.MonkeyPatch, issue: float, busy: float, bound: bool) -> None:
    """The figures come from the host clock and the device's events, as the loop takes them:
    a device-bound rung has a small host_boundness and a growing lag; a host-bound one ~1 and ~0."""
    now = [0.0]
    monkeypatch.setattr(loop, "time", type("T", (), {"perf_counter": staticmethod(lambda: now[0])}))
    dev = _FakeDevice(now, busy)
    steps, warmup = 8, 2
    clock = loop._StepClock(CPU, steps, event=dev.event)
    for step in range(steps):
        clock.mark(step)
        dev.free = max(dev.free, now[0]) + busy  # this step's kernels, queued behind the last
        now[0] += issue
        clock.issued(step)
        now[0] += 0.0005  # the next batch, the progress line
    clock.stop(CPU)
    boundness, lag = clock.host_figures(warmup)
    assert clock.host_issue_s() == pytest.approx([issue] * steps)
    step = max(issue + 0.0005, busy)
    assert boundness == pytest.approx(issue / step, rel=1e-6)
    m = loop.Measurement(clock.step_times(), np.zeros(steps), 1.0, steps - warmup, host_issue_s=clock.host_issue_s(),
                         host_boundness=boundness, device_lag_s=lag)
    attrs = loop.host_attrs(m, warmup)
    assert attrs[Host.host_bound] is bound and checked(attrs)
    assert (lag < 1e-9) if bound else (lag > busy)


def test_host_boundness_is_absent_on_the_cpu() -> None:
    """On the CPU every step's issue time is recorded, but no figure: no device waits."""
    model = Counting()
    with one_rank_group():
        m = train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), [{"x": torch.ones(2)}] * 4, steps=4, warmup=1,
                       prec=policy("fp32"), device=CPU)
    assert len(m.host_issue_s) == 4 and (m.host_issue_s > 0).all()
    assert np.isnan(m.host_boundness) and loop.host_attrs(m, 1) == {}


def test_bench_host_counts_top_level_ops_and_gpu_syncs_only() -> None:
    """Nested aten ops count once; a boolean-mask index's nonzero counts; the CPU fused
    optimizer's .item() (the CUDA kernel reads the step on the device) does not."""
    from bench_host import top_level_ops

    def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}

    events = [op("aten::linear", 0, 10), op("aten::addmm", 1, 5), op("aten::index", 20, 5), op("aten::nonzero", 21, 2),
              op("aten::item", 30, 2), op("aten::_local_scalar_dense", 30.5, 1), op("aten::_fused_adamw_", 40, 10),
              op("aten::item", 41, 1), op("aten::_local_scalar_dense", 41.2, 0.5), op("aten::mm", 5, 1, tid=2),
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 60, "tid": 1}]
    assert top_level_ops(events) == (5, 2)


def test_bench_host_sweeps_fsdp2_rungs_over_unit_sizes() -> None:
    """--units K,...: each FSDP2 rung at every k (its prefetch kept; k = 1 as given), the rest once;
    a rung may name its knobs (model/strategy/knobs/b<batch>)."""
    from bench_host import parse_rung, split_knobs, with_units

    rungs = ["vit-base-skeleton/single/b2", "vit-base-skeleton/fsdp2-full/b2", "vit-base-skeleton/fsdp-full/b2",
             "vit-debug/fsdp2-full-ac/pf1/b4"]
    assert with_units(rungs, [1, 2, 4]) == [
        "vit-base-skeleton/single/b2", "vit-base-skeleton/fsdp2-full/b2", "vit-base-skeleton/fsdp2-full/pf0-u2/b2",
        "vit-base-skeleton/fsdp2-full/pf0-u4/b2", "vit-base-skeleton/fsdp-full/b2", "vit-debug/fsdp2-full-ac/pf1/b4",
        "vit-debug/fsdp2-full-ac/pf1-u2/b4", "vit-debug/fsdp2-full-ac/pf1-u4/b4"]
    assert parse_rung("vit-debug/fsdp2-full/pf0-u2/b4") == ("vit-debug", "fsdp2-full:pf0-u2", 4)
    assert split_knobs("fsdp2-full:pf0-u2") == ("fsdp2-full", "pf0-u2") and split_knobs("single") == ("single", "")
    with pytest.raises(SystemExit, match="model/strategy"):
        parse_rung("vit-debug/fsdp2-full/pf0/u2/b4")


@pytest.mark.process
def test_bench_host_quick_runs_rungs_and_compares_them_with_single(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "h.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_host.py"), "--quick", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "SCALELADDER_LOG_LEVEL": "WARNING"})
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["strategy"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"single", "fsdp-full"} and "| vit-debug/fsdp-full/b4 |" in run.stdout
    assert rows["single"]["aten_ops_per_step"] > 100 and rows["single"]["syncs_per_step"] == 0
    assert rows["fsdp-full"]["host_vs_single"] > 0 and rows["single"]["host_vs_single"] == 1.0


def test_the_report_lists_host_bound_rungs_with_what_to_try() -> None:
    from scaleladder.figures import report

    def rung(spec: str, bound: bool, wrapper: str) -> dict:
        return {"status": "ok", "spec": spec, "model": "vit-base", "strategy": spec.split("/")[1], "wrapper": wrapper,
                "host_bound": bound, "host_boundness": 0.97 if bound else 0.95, "host_issue_median_s": 0.048,
                "step_time_median_s": 0.049, "items_per_s": 2600.0}

    lines = report.host_bound([rung("vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n1/b128", True, "fsdp"),
                               rung("vit-base/single/bf16-mixed/pre-lag/n1/b128", False, "single"),  # lagged: device-bound
                               rung("vit-base/single-compile/bf16-mixed/pre-lag/n1/b32", True, "single")])
    assert len(lines) == 2 and "host_boundness 0.97" in lines[0] and "48.0 ms to issue a 49.0 ms step" in lines[0]
    assert "-compile" in lines[0] and "-sac instead of -ac" in lines[0] and "use_orig_params=False" in lines[0]
    assert "single-compile" in lines[1] and "try a larger batch" in lines[1]


def test_bench_data_compares_the_transports(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_data.py's loader lines: float32 against uint8 across the
    workers' boundary, each with the bytes per batch that cross and the host CPU per batch."""
    import re
    import sys
    from pathlib import Path

    from scaleladder.data.shard_command import main as shard

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_data

    assert shard(["--out", str(tmp_path / "s"), "--samples", "16", "--per-shard", "16", "--image-size", "40", "--quiet"]) == 0
    capsys.readouterr()
    sent = {}
    for transport in ("float32", "uint8"):
        bench_data.bench_loader(tmp_path / "s", "vit-debug", batch=4, batches=1, workers=0, repeats=1, warmup=1, transport=transport)
        line = capsys.readouterr().out
        assert f" {transport} " in line and "samples per worker CPU-second" in line, line
        sent[transport] = float(re.search(r"([0-9.]+) MB/batch crossing", line).group(1))  # type: ignore[union-attr]
    assert sent["float32"] > 3.5 * sent["uint8"] > 0
