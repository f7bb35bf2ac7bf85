"""GPU-only faults, seen on the CPU.

gloo and the CPU forgive what NCCL/RCCL and a GPU refuse. Each test here looks at the
property that a GPU would enforce, in a form a CPU can check:

* a collective on a CPU tensor under an NCCL group (the probe order);
* a host sync inside the step (every scalar read is counted, by a dispatch mode);
* bf16-true that does not train (a short training run against fp32);
* a loss scaler whose inf flag is not shared by the ranks (two gloo ranks);
* the device-memory figure and the device feed's contract.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.gloo import one_rank_group
from scaleladder.flavors import get_flavor
from scaleladder.models.build import build_model
from scaleladder.rung import loop, parallelize, unused_params
from scaleladder.rung.batches import SyntheticBatches
from scaleladder.rung.feed import DeviceFeed
from scaleladder.rung.optim import make_optimizer, make_scaler
from scaleladder.rung.precision import policy
from scaleladder.spec import Knobs, default_knobs, parse_strategy

CPU = torch.device("cpu")
HELPERS = Path(__file__).parent / "helpers"


@pytest.fixture
def private_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a `run` inside this process: launch.init exports MASTER_PORT/RANK/WORLD_SIZE,
    which would make every later subprocess believe it was started by torchrun."""
    monkeypatch.setattr(os, "environ", dict(os.environ))

# -- fault 1: the unused-parameter probe must run before the process group ---------------


def test_the_probe_refuses_to_run_inside_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under NCCL the probe's CPU forward dies in FLAVA's contrastive all-gather; gloo
    lets it through, so the probe itself refuses a group a CPU test can see."""
    monkeypatch.setattr(unused_params, "_UNUSED_CACHE", {})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="before the process group exists"):
            unused_params.unused_parameter_names("flava")
    finally:
        dist.destroy_process_group()
    assert "flava" not in unused_params._UNUSED_CACHE


@pytest.mark.parametrize("strategy", ["single", "fsdp-full"])
def test_a_flava_rung_probes_before_it_makes_its_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str,
                                                      private_environ: None) -> None:
    """The order the runner keeps, for every strategy (`single` included: the group exists
    for one rank too). Fails on a runner that probes while wrapping (after the group)."""
    from scaleladder import cli
    from scaleladder.rung import launch

    events: list[str] = []
    real_probe, real_init = unused_params.unused_parameter_names, launch.init

    def probe(family: str) -> frozenset[str]:
        events.append(f"probe:{family}:{'group' if dist.is_initialized() else 'no-group'}")
        return real_probe(family)

    def init(*a: object, **k: object) -> None:
        events.append("init")
        real_init(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(unused_params, "_UNUSED_CACHE", {})
    monkeypatch.setattr(unused_params, "unused_parameter_names", probe)
    monkeypatch.setattr(launch, "init", init)
    out = tmp_path / "r.h5"
    rc = cli.main(["run", "--spec", f"flava-debug/{strategy}/fp32/pre-lag/n1/b4", "--steps", "2", "--warmup", "1",
                   "--out", str(out), "--device", "cpu"])
    assert rc == 0 and out.is_file()
    assert events[0] == "probe:flava:no-group" and events.index("init") > 0, events
    assert all(e.endswith("no-group") or e == "init" or "group" in e and e.startswith("probe") for e in events)
    # every later lookup hits the cache: no probe forward ever runs inside the group
    assert unused_params._UNUSED_CACHE.keys() == {"flava"}


# -- faults 3 and 9: host syncs inside the step ---------------------------------------------

# Ops that make the host wait for the device on a GPU: a scalar read (.item(), bool(t),
# float(t)) and the ops whose output size depends on the data.
SYNC_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.is_nonzero",
            "aten._unique2", "aten.unique_consecutive", "aten.unique_dim", "aten.repeat_interleave"}
# Indexing with a boolean mask (x[mask], x[mask] = v) syncs too, but its nonzero runs
# inside the kernel, below the dispatcher: it is seen as the index op with a bool index.
MASK_INDEX_OPS = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}


def _has_bool_index(args: tuple) -> bool:  # type: ignore[type-arg]
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


class SyncCounter(TorchDispatchMode):
    """Counts the host-syncing ops dispatched while active (also those of the backward,
    which on the CPU runs in the calling thread, and of DDP's C++ reducer)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        if name in SYNC_OPS or name in MASK_INDEX_OPS and _has_bool_index(args):
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_the_counter_sees_each_kind_of_sync() -> None:
    x, mask = torch.arange(4.0), torch.tensor([True, False, True, False])
    with SyncCounter() as c:
        x.sum().item()
        x[mask]
        x[mask] = 0.0
        x[torch.tensor([0, 1])]  # integer indexing has a known size: no sync
    assert c.counts == {"aten._local_scalar_dense": 1, "aten.index": 1, "aten.index_put_": 1}, c.counts


def _syncs(flavor_name: str, strategy: str, precision: str, steps: int) -> int:
    """Host syncs in a whole train_loop of ``steps`` steps (its fixed ends included)."""
    flavor, prec = get_flavor(flavor_name), policy(precision)
    torch.manual_seed(0)
    model = build_model(flavor, CPU).to(dtype=prec.storage_dtype)
    wrapped, _ = parallelize.apply_strategy(model, parse_strategy(strategy), default_knobs(parse_strategy(strategy)), prec, CPU)
    opt = make_optimizer(wrapped.parameters(), 1e-4, precision)
    scaler = make_scaler(precision, parse_strategy(strategy), CPU)
    batches = SyntheticBatches(flavor, 4, 0, steps, 0, CPU, dtype=prec.storage_dtype)
    with SyncCounter() as c:
        loop.train_loop(wrapped, opt, batches, steps=steps, warmup=1, prec=prec, device=CPU, scaler=scaler)
    return sum(c.counts.values())


def per_step_syncs(flavor: str, strategy: str, precision: str) -> float:
    # The loop's two ends sync on purpose (window start/end, the results' copy to the
    # host): the difference between two lengths is what each step adds.
    with one_rank_group():
        return (_syncs(flavor, strategy, precision, 6) - _syncs(flavor, strategy, precision, 3)) / 3


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true"])
def test_a_vit_step_never_syncs_the_host(precision: str) -> None:
    """fp16-mixed used to read the inf flag (GradScaler.step's .item()) and foreach AdamW
    its step counters every step; the fused optimizer does neither."""
    assert per_step_syncs("vit-debug", "single", precision) == 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp-full", "fsdp-full-ac", "fsdp2-full", "fsdp2-full-ac"])
def test_no_wrapper_adds_a_host_sync_to_the_step(strategy: str) -> None:
    assert per_step_syncs("vit-debug", strategy, "fp16-mixed") == 0


# docs/metrics.md states this number and where each comes from: torchmultimodal's FLAVA
# (2024.4.1) indexes by boolean masks 13 times in the forward (the MLM/MIM/ITM heads,
# the contrastive loss, the text encoder's padding mask), reads isnan() twice, and the
# backward of five of those indexings syncs again.
FLAVA_SYNCS_PER_STEP = 20


def test_flava_syncs_only_where_torchmultimodal_does() -> None:
    assert per_step_syncs("flava-debug", "single", "bf16-mixed") == FLAVA_SYNCS_PER_STEP


# -- fault 4: bf16-true must train ------------------------------------------------------------


def _final_loss(precision: str, steps: int = 200) -> float:
    flavor, prec = get_flavor("vit-debug"), policy(precision)
    torch.manual_seed(0)
    model = build_model(flavor, CPU).to(dtype=prec.storage_dtype)
    wrapped, _ = parallelize.apply_strategy(model, parse_strategy("single"), Knobs(), prec, CPU)
    opt = make_optimizer(wrapped.parameters(), 1e-4, precision)
    m = loop.train_loop(wrapped, opt, SyntheticBatches(flavor, 8, 0, steps, 0, CPU, dtype=prec.storage_dtype),
                         steps=steps, warmup=1, prec=prec, device=CPU)
    return float(np.mean(m.loss[-10:]))


def test_bf16_true_trains_like_fp32() -> None:
    """With bf16 AdamW states an lr 1e-4 update is below half a bf16 ulp for |w| > 0.026:
    the old bf16-true ended at 1.09 where fp32 reached 0.30 (same rung, 200 steps)."""
    with one_rank_group():
        fp32, bf16 = _final_loss("fp32"), _final_loss("bf16-true")
    start = float(np.log(get_flavor("vit-debug").num_classes))
    assert fp32 < 0.5 * start  # the check means something: fp32 learns
    assert abs(bf16 - fp32) < 0.25 * (start - fp32), (fp32, bf16)


def test_bf16_true_keeps_bf16_weights_and_fp32_masters() -> None:
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    opt = make_optimizer(model.parameters(), 1e-4, "bf16-true")
    model(torch.ones(2, 4, dtype=torch.bfloat16)).sum().backward()
    before = model.weight.detach().clone()
    opt.step()
    master = opt.masters[0]
    assert model.weight.dtype == torch.bfloat16 and master.dtype == torch.float32
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.float32}
    # a step far below a bf16 ulp still moves the master, and the weight is its rounding
    assert not torch.equal(master, before.float())
    assert torch.equal(model.weight, master.to(torch.bfloat16))
    assert master.grad is None  # the fp32 gradient copies live only for the step
    opt.zero_grad()
    assert model.weight.grad is None


def test_bf16_true_masters_work_on_fsdp2_shards() -> None:
    """FSDP2's parameters are DTensors, and DTensor has no rule for the _foreach_copy_ that
    rounds the masters back ("does not have a sharding strategy registered"): the masters
    are plain fp32 tensors over each local shard, and the bf16 shards move."""
    from torch.distributed.tensor import DTensor

    flavor, prec = get_flavor("vit-debug"), policy("bf16-true")
    with one_rank_group():
        torch.manual_seed(0)
        model = build_model(flavor, CPU).to(dtype=torch.bfloat16)
        strategy = parse_strategy("fsdp2-full")
        wrapped, _ = parallelize.apply_strategy(model, strategy, default_knobs(strategy), prec, CPU)
        opt = make_optimizer(wrapped.parameters(), 1e-3, "bf16-true")
        before = [p.to_local().clone() for p in wrapped.parameters()]
        m = loop.train_loop(wrapped, opt, SyntheticBatches(flavor, 4, 0, 3, 0, CPU, dtype=torch.bfloat16), steps=3, warmup=1, prec=prec, device=CPU)
    assert all(isinstance(p, DTensor) and p.dtype == torch.bfloat16 for p in wrapped.parameters())
    assert not any(isinstance(master, DTensor) for master in opt.masters)
    assert all(master.dtype == torch.float32 for master in opt.masters)
    assert sum(not torch.equal(b, p.to_local()) for b, p in zip(before, wrapped.parameters())) > len(before) // 2
    assert np.all(np.isfinite(m.loss))


# -- the loss scaler's inf flag under FSDP1 and FSDP2 ----------------------------------------


@pytest.mark.process
def test_the_scaler_skips_the_step_on_every_rank_or_none() -> None:
    """Two real gloo ranks, both FSDP generations, an inf in one rank's shard or in all.

    FSDP1: fused AdamW + ShardedGradScaler.step checks infs per rank only (the base class's
    check, no all-reduce): a rank whose shard holds an inf skips, the others step, and the
    replicas diverge; unscale_ first shares the flag. And that all-reduce SUMS the flags:
    with an inf on both ranks the flag was 2, which the fused kernel (it skips only on
    exactly 1.0) did not skip: NaN weights and a step counter of -1, until the runner's
    scaler clamped the flag to 1.
    FSDP2: the gradients are DTensors and DTensor's inf check reduces the flag (MAX) over the
    mesh, so the plain GradScaler the runner gives FSDP2 makes the ranks agree."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(HELPERS / "scaler_worker.py")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    lines = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("CASE"))
    expected = []
    for generation in ("fsdp1", "fsdp2"):
        for rank in (0, 1):
            expected.append(f"CASE {generation} all-inf RANK {rank} skipped=True finite=True scale=32768.0 step=0")
            expected.append(f"CASE {generation} clean RANK {rank} skipped=False finite=True scale=65536.0 step=1")
            expected.append(f"CASE {generation} one-inf RANK {rank} skipped=True finite=True scale=32768.0 step=0")
    assert lines == sorted(expected), p.stdout


def test_fsdp2_takes_the_plain_scaler_and_fsdp1_the_sharded_one() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert isinstance(make_scaler("fp16-mixed", parse_strategy("fsdp-full"), CPU), ShardedGradScaler)
    for s in ("fsdp2-full", "fsdp2-hybrid2-ac", "ddp", "single-compile"):
        scaler = make_scaler("fp16-mixed", parse_strategy(s), CPU)
        assert type(scaler) is torch.amp.GradScaler, s
    assert make_scaler("bf16-mixed", parse_strategy("fsdp2-full"), CPU) is None


# -- fault 6 and 5: what the device reports; batches fed from the host ------------------------


def test_the_device_peak_adds_what_the_allocator_does_not_see() -> None:
    gib = 2**30
    # 80 GiB device: 62 in use now, of which the allocator reserves 60; its window peak was 70
    assert loop.device_peak_used(62 * gib, 60 * gib, 70 * gib) == 72 * gib
    assert loop.device_peak_used(0, 0, 0) == 0


def test_a_rung_records_the_device_memory_figure(tmp_path: Path, private_environ: None) -> None:
    import h5py

    from scaleladder import cli

    out = tmp_path / "r.h5"
    assert cli.main(["run", "--spec", "vit-debug/single/bf16-true/pre-lag/n1/b4", "--steps", "3", "--warmup", "1",
                     "--out", str(out), "--device", "cpu"]) == 0
    with h5py.File(out) as f:
        # the CPU has no device figure: zero, as for the allocator's (docs/metrics.md)
        assert f.attrs["peak_device_used_gib"] == 0 and f.attrs["device_total_gib"] == 0
        assert f["memory/peak_device_used_bytes"].shape == (1,)


def test_the_feed_converts_after_the_copy_and_keeps_the_count() -> None:
    host = [{"image": torch.full((2, 3), float(i)), "label": torch.tensor([i, i])} for i in range(5)]
    feed = DeviceFeed(host, CPU, torch.bfloat16, steps=5)
    got = list(feed)
    assert len(got) == 5 and [int(b["label"][0]) for b in got] == [0, 1, 2, 3, 4]
    assert all(b["image"].dtype == torch.bfloat16 and b["label"].dtype == torch.int64 for b in got)
    assert all(h["image"].dtype == torch.float32 for h in host)  # the host batches stay fp32 (pinned on a GPU)
    assert feed.wait_s.shape == (5,) and (feed.wait_s >= 0).all()
