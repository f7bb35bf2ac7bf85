"""The planner held against torch's own memory trackers: the suite's fast subset.

Each case builds the model on FAKE CPU tensors, wraps it with the runner's ladder, and runs two
training steps of the runner's own step under torch's ``MemTracker`` (``FSDPMemTracker`` for FSDP2,
on the fake process group as rank 0 of 8 or 16; FSDP1, HYBRID and DDP too), then compares the second step's peak and the static
categories with ``scaleladder plan`` (scaleladder.campaign.plan_check). One case per mechanism: plain
single-rank training, activation checkpointing under autocast (a term since fixed: 5.4% over
the tracker before the fix at this batch), FSDP2 sharding with AC. The full matrix (vit-base and
vit-huge × single, single-ac, fsdp2-full, fsdp2-full-ac × two batches) is
benchmarks/bench_plan_check.py, its table in docs/planner.md.

Tolerance 5% on the peak: against the tracker on the same fake step, what is left are
allocator-level details (512-byte rounding of small tensors, when a temporary dies); measured at
+1.5%, +2.0% and +2.3% for these three cases on dev-cpu, and within ±4.6% over the whole ViT
matrix (docs/planner.md). 5% is about twice these cases' error, half the 10% the GPU check asks of
the planner against real memory, and below the 5.4% of the fault this subset must catch.
Parameters must match exactly; the optimizer state to 0.1% (fused AdamW's step counters: the
planner counts a 512-byte block each).
"""

from __future__ import annotations

import pytest

from scaleladder.campaign.plan_check import measure
from scaleladder.cli import main as cli
from scaleladder.spec import RunSpec, SpecError

TOLERANCE = 0.05

CASES = [
    ("vit-base/single/bf16-mixed/pre-lag/n1/b8", 1),
    ("vit-base/single-ac/bf16-mixed/pre-lag/n1/b32", 1),  # autocast copies under non-reentrant AC
    ("vit-base/fsdp2-full-ac/bf16-mixed/pf0/n1/b32", 8),  # FSDP2 on the fake process group
    # Every wrapper at a CI-sized world (the campaign's are 8-64; the same code at world 64: docs/planner.md).
    # dev-cpu, vit-base b8: fsdp-full +0.6%, fsdp-hybrid8 +0.6%, ddp +1.2%, fsdp2-hybrid8 -1.0%, 3-13 s each.
    ("vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b8", 8),  # FSDP1 sharded: its gathered flat params mapped
    ("vit-base/fsdp-hybrid8/bf16-mixed/pre-lag/n2/b8", 16),  # FSDP1 HYBRID on a 2-D mesh made before fake mode
    ("vit-base/ddp/bf16-mixed/pre-lag/n1/b8", 8),  # DDP: init_sync=False, a comm hook, no bucket rebuild
    ("vit-base/fsdp2-hybrid8/bf16-mixed/pf0/n2/b8", 16),  # FSDP2 HSDP
    # The sdpa FLAVA (what a rung builds): fused attention, batched twin passes, sync-free heads
    # over every token. TorchMultimodal's own FLAVA cannot run on fake tensors (its boolean-mask
    # indexing). Measured +0.5% on dev-cpu (its FSDP1 rungs: docs/planner.md, "Validation").
    ("flava-debug/single/bf16-mixed/pre-lag/n1/b4", 1),
]


@pytest.mark.parametrize("spec,world", CASES)
def test_the_planner_agrees_with_torchs_memory_tracker(spec: str, world: int) -> None:
    from scaleladder.planner.inventory import inventory
    from scaleladder.planner.static import ALLOC_BLOCK_BYTES

    c = measure(RunSpec.from_path(spec), world)
    assert abs(c.error) <= TOLERANCE, "\n".join(c.lines())
    params, optimizer = c.static("params"), c.static("optimizer")
    assert params[0] == params[1] > 0, c.lines()
    # Fused AdamW's step counters: the planner counts a 512-byte block each, which the tracker files
    # elsewhere; 0.1% of vit-base's state, but a debug flavor's state is small beside its ~100 counters.
    inv = inventory(RunSpec.from_path(spec).model)
    counters = sum(1 for u in inv.units() for p in u.params if p.trainable) * ALLOC_BLOCK_BYTES
    assert abs(optimizer[1] - optimizer[0]) <= max(1e-3 * optimizer[0], counters), c.lines()


def test_plan_check_prints_both_figures_and_refuses_what_it_cannot_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["plan", "--spec", "vit-debug/fsdp2-full/bf16-mixed/pf0/n1/b4", "--check", "--check-world", "8"]) == 0
    out = capsys.readouterr().out
    assert "vit-debug/fsdp2-full/bf16-mixed/pf0/n1/b4 at world 8: planner " in out and "torch's tracker" in out
    assert "planned/tracked - 1 = " in out
    with pytest.raises(SpecError, match="does not cover FLAVA --flava-impl torchmultimodal"):
        measure(RunSpec.from_path("flava-debug/single/bf16-mixed/pre-lag/n1/b4"), flava_impl="torchmultimodal")


def test_fsdp1_on_one_rank_is_planned_as_torch_runs_it() -> None:
    # FSDP1 clamps FULL_SHARD / SHARD_GRAD_OP to NO_SHARD on a one-rank group (planner.timeline.fsdp1_as_run):
    # nothing gathered in fp32, and the same peak as the no-shard rung. Against the tracker (dev-cpu,
    # `scaleladder plan --spec flava-debug/fsdp-full/fp32/pre-lag/n1/b4 --check`): +8.6% before, -0.6% after.
    from scaleladder.planner.memory import predict

    full = predict(RunSpec.from_path("flava-debug/fsdp-full/fp32/pre-lag/n1/b4"), 1, 1, "cpu")
    no_shard = predict(RunSpec.from_path("flava-debug/fsdp-no-shard/fp32/pre-lag/n1/b4"), 1, 1, "cpu")
    assert full.breakdown.get("buffers", 0) == 0 and full.peak_bytes == no_shard.peak_bytes
    # on two ranks it shards, and gathers
    assert predict(RunSpec.from_path("flava-debug/fsdp-full/fp32/pre-lag/n1/b4"), 2, 2, "cpu").peak_bytes != full.peak_bytes


@pytest.mark.parametrize("spec,world", [
    ("vit-debug/fsdp-full/bf16-mixed/pre-lag/n1/b4", 8), ("vit-debug/fsdp-grad-op/bf16-mixed/pre-lag/n1/b4", 8),
    ("vit-debug/fsdp-no-shard/bf16-mixed/pre-lag/n1/b4", 8), ("vit-debug/fsdp-hybrid8/bf16-mixed/pre-lag/n2/b4", 16),
    ("vit-debug/ddp/bf16-mixed/pre-lag/n1/b4", 8), ("vit-debug/fsdp2-hybrid8/bf16-mixed/pf0/n2/b4", 16),
    ("vit-debug/fsdp2-hybrid1/bf16-mixed/pf0/n1/b4", 8),
])
def test_the_collectives_bytes_are_the_planners_volumes(spec: str, world: int) -> None:
    # Counted in the traced step (FSDP's c10d ops by a dispatch mode, DDP's in its comm hook), against
    # planner/steptime.py's stages walked for bytes; within 1% (equal but for fsdp-no-shard's -0.02%).
    from scaleladder.campaign.plan_check import planned_collectives

    c = measure(RunSpec.from_path(spec), world)
    planned = planned_collectives(RunSpec.from_path(spec), world)
    assert set(c.collectives) == set(planned) and c.collectives, (c.collectives, planned)
    for kind, n in c.collectives.items():
        assert planned[kind] == pytest.approx(n, rel=0.01), (kind, c.collectives, planned)
