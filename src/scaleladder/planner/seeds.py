"""The seeds' claims recomputed: what tests/test_plan.py asserts and docs/planner.md tabulates.

Each claim is a question about one rung (does it fit at this batch? how far does the
batch go?) asked twice: for scaleladder's runner (``RUNNER``) and for the code the seed
ran (``SEED_FLAVA``, ``ORNL_VIT``: one :class:`~.memory.Variant` switch per mechanism
that code did differently). Nothing here tunes a constant. Instead, every verdict comes
with its **flip factor**: the factor by which the three overhead constants
(fragmentation, CUDA context, communication library; see ``memory.Overheads``) would
all have to be scaled for the verdict to change. They are estimates, not
measurements, so a verdict whose flip factor lies in [0.5, 1.5] hangs on them.

``python -m scaleladder.planner.seeds`` prints the tables in docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.markdown import row
from scaleladder.planner.devices import DEVICES
from scaleladder.planner.memory import (
    CALIBRATED,
    GIB,
    Overheads,
    Variant,
    max_batch_for,
    required_bytes,
)
from scaleladder.planner.step_setup import step_setup
from scaleladder.planner.timeline import simulate
from scaleladder.spec import Knobs, parse_strategy

A100 = "a100-40gb"
GCD = "mi250x-gcd"
FLAVA = ("flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b")
FLAVA_STRATEGIES = ("ddp", "fsdp-full", "fsdp-full-ac")

# The runner's mechanisms (fused AdamW in every precision: scaleladder.rung.optim.make_optimizer), on
# the model the seeds measured: TorchMultimodal's FLAVA as the package builds it (`scaleladder run
# --flava-impl torchmultimodal`), so that each claim compares like with like. A rung's default FLAVA
# (`sdpa`: fused attention, batched twin passes, sync-free losses) is RUNNER_SDPA: it fits more.
RUNNER = Variant(flava_impl="torchmultimodal")
RUNNER_SDPA = Variant()
# The FLAVA seed's examples/flava/native/train.py: REENTRANT checkpointing under FSDP, MixedPrecision
# without param_dtype (fp32 all-gathers), DDP(gradient_as_bucket_view=True), and torch.optim.AdamW
# with no foreach/fused argument (model.py get_optimizer). That code was written Aug–Oct 2022 for
# "PyTorch 1.13 or nightly", whose AdamW then ran the for-loop implementation: foreach became the
# default on CUDA only in 2023 (pytorch#92306, and for nn.Parameters only with #95862).
# Which of the three it ran changes none of the seed's verdicts (tests/test_plan.py checks all three).
# It ran TorchMultimodal's FLAVA as the package builds it (flava_impl="torchmultimodal").
SEED_FLAVA = Variant(gather_across_passes=False, gathered_param_bytes=4, bucket_view=True, adamw="for-loop",
                     frozen_units=False, flava_impl="torchmultimodal")
# Its loader's text-only MLM batches were 512 tokens; pairs of 512 tokens bound them from above.
SEED_FLAVA_512 = Variant(gather_across_passes=False, gathered_param_bytes=4, bucket_view=True, adamw="for-loop",
                         text_len=512, frozen_units=False, flava_impl="torchmultimodal")
# ORNL's ViT-FSDP: torch.optim.AdamW(..., fused=cfg.use_fused_optimizer); its measured peaks hold
# 16 B/param in the step (see the docs), i.e. no foreach temporary: the same optimizer as ours.
ORNL_VIT = Variant(adamw="fused")
# torch's default AdamW on a GPU (foreach), with TorchMultimodal's FLAVA: the foreach columns, and the
# verdicts that would differ with it.
FOREACH = Variant(adamw="foreach", flava_impl="torchmultimodal")

BORDERLINE = (0.5, 1.5)  # flip factors in this range: the verdict hangs on the overhead estimates


@dataclass(frozen=True)
class Fit:
    """Does one rung fit, and by how much."""

    model: str
    strategy: str
    world: int
    device: str
    batch: int
    peak: float  # bytes, the allocator's peak
    required: int  # bytes: peak + overheads (calibrated)
    capacity: int
    phase: str  # where the peak is

    @property
    def fits(self) -> bool:
        return self.required <= self.capacity

    @property
    def margin_gib(self) -> float:
        """Capacity minus what must fit: > 0 fits with room, < 0 misses by that much."""
        return (self.capacity - self.required) / GIB

    @property
    def flip_factor(self) -> float:
        """k with required(overheads × k) == capacity: fits for k below it, not above.

        ``required`` is linear in k (peak·(1 + k·frag) + k·fixed), so k solves exactly.
        Negative: does not fit even with no overhead at all."""
        per_k = self.peak * CALIBRATED.fragmentation + CALIBRATED.fixed(self.world)
        return (self.capacity - self.peak) / per_k

    @property
    def borderline(self) -> bool:
        return BORDERLINE[0] <= self.flip_factor <= BORDERLINE[1]


def fit(model: str, strategy: str, world: int, device: str, batch: int, variant: Variant = RUNNER,
        precision: str = "bf16-mixed") -> Fit:
    st = step_setup(model, parse_strategy(strategy), precision, Knobs(), world, variant)
    tl = simulate(st, batch)
    cap = DEVICES[device]
    assert cap is not None
    return Fit(model, strategy, world, device, batch, tl.peak, required_bytes(tl.peak, world), cap, tl.phase)


def max_batch(model: str, strategy: str, world: int, device: str, variant: Variant = RUNNER,
              overheads: Overheads = CALIBRATED, precision: str = "bf16-mixed") -> int | None:
    st = step_setup(model, parse_strategy(strategy), precision, Knobs(), world, variant)
    return max_batch_for(st, DEVICES[device], overheads)


def flava_max_batches(variant: Variant, overheads: Overheads = CALIBRATED) -> dict[str, list[int | None]]:
    """Max local batch on 8 × A100 40GB, per strategy, in FLAVA order."""
    return {s: [max_batch(m, s, 8, A100, variant, overheads) for m in FLAVA] for s in FLAVA_STRATEGIES}


def fitting(strategy: str, variant: Variant = RUNNER, batch: int = 1) -> list[str]:
    """The FLAVA flavors that fit on 8 × A100 40GB at ``batch``."""
    return [m for m in FLAVA if fit(m, strategy, 8, A100, batch, variant).fits]


def batch_ratios(variant: Variant, overheads: Overheads = CALIBRATED) -> tuple[float, float, int | None]:
    """(FSDP+AC / DDP max batch at 350M, the same at 900M, FSDP+AC max batch at 10B)."""
    mb = flava_max_batches(variant, overheads)
    ac, ddp = mb["fsdp-full-ac"], mb["ddp"]
    assert ac[0] and ac[1] and ddp[0] and ddp[1]
    return ac[0] / ddp[0], ac[1] / ddp[1], ac[5]


# The ViT seed: local batch 32 on MI250X GCDs, AC on (the ORNL code's default), bf16 assumed.
VIT_CASES = (("vit-3b", "fsdp-no-shard-ac", 1), ("vit-3b", "ddp-ac", 1), ("vit-5b", "fsdp-no-shard-ac", 1),
             ("vit-5b", "fsdp-hybrid2-ac", 2), ("vit-15b", "fsdp-hybrid2-ac", 2), ("vit-15b", "fsdp-hybrid4-ac", 4),
             ("vit-15b", "fsdp-hybrid8-ac", 8))


def vit_fit(model: str, strategy: str, gcds: int, variant: Variant = RUNNER) -> Fit:
    return fit(model, strategy, gcds, GCD, 32, variant)


# -- the tables of docs/planner.md ------------------------------------------------------------


def _fit_cell(f: Fit) -> str:
    verdict = "fits" if f.fits else "no"
    flag = " **borderline**" if f.borderline else ""
    return f"{verdict}: {f.required / GIB:.2f} of {f.capacity / GIB:.2f} GiB ({f.margin_gib:+.2f}), k* {f.flip_factor:.2f}{flag}"


def tables() -> str:
    out = ["Max local batch, FLAVA on 8 × A100 40GB (bf16-mixed, synthetic pairs):", ""]
    for name, v in (("runner", RUNNER), ("seed's mechanisms", SEED_FLAVA), ("seed's mechanisms, 512-token text", SEED_FLAVA_512)):
        mb = flava_max_batches(v)
        out += [f"{name}:", row(["model", *FLAVA_STRATEGIES]), row(["---"] * 4)]
        out += [row([m, *(str(mb[s][i] or "–") for s in FLAVA_STRATEGIES)]) for i, m in enumerate(FLAVA)]
        out.append("")
    out += ["Fit at local batch 1 (required of capacity, margin, flip factor k*):", ""]
    for name, v in (("runner", RUNNER), ("seed's mechanisms", SEED_FLAVA)):
        out += [f"{name}:", row(["model", *FLAVA_STRATEGIES]), row(["---"] * 4)]
        out += [row([m, *(_fit_cell(fit(m, s, 8, A100, 1, v)) for s in FLAVA_STRATEGIES)]) for m in FLAVA]
        out.append("")
    out += ["Batch ratios (FSDP+AC / DDP at 350M, at 900M; 10B's FSDP+AC max batch) with overheads × k:", "",
            row(["variant", "k = 0.5", "k = 1", "k = 1.5"]), row(["---"] * 4)]
    for name, v in (("runner", RUNNER), ("seed's mechanisms", SEED_FLAVA), ("seed, 512-token text", SEED_FLAVA_512)):
        cells = []
        for k in (0.5, 1.0, 1.5):
            r350, r900, ten = batch_ratios(v, CALIBRATED.scaled(k))
            cells.append(f"{r350:.2f}×, {r900:.2f}×, {ten or '–'}")
        out.append(row([name, *cells]))
    out += ["", "ViT on MI250X GCDs, local batch 32 (runner = fused AdamW = ORNL's; foreach = torch's default AdamW on a GPU):",
            "", row(["model", "strategy", "GCDs", "runner (fused AdamW)", "peak", "foreach AdamW"]), row(["---"] * 6)]
    for m, s, g in VIT_CASES:
        f = vit_fit(m, s, g)
        out.append(row([m, s, str(g), _fit_cell(f), f"{f.peak / 1e9:.1f} GB at {f.phase}", _fit_cell(vit_fit(m, s, g, FOREACH))]))
    return "\n".join(out)


# FSDP1 against FSDP2 (docs/planner.md, "FSDP2 against FSDP1"): the seeds' flavors, 8 ranks.
FSDP2_CASES = (("flava-2.7b", "a100-40gb", 8), ("flava-4.8b", "a100-40gb", 4), ("flava-10b", "a100-40gb", 1),
               ("vit-3b", "mi250x-gcd", 32), ("vit-5b", "mi250x-gcd", 32), ("vit-15b", "mi250x-gcd", 8))


def fsdp2_table() -> str:
    """Per-GPU peak / required GiB, fsdp-full vs fsdp2-full (default knobs), with and without AC."""
    from scaleladder.planner.memory import GIB, predict
    from scaleladder.spec import RunSpec, default_knobs

    def cell(model: str, strat: str, dev: str, b: int) -> str:
        st = parse_strategy(strat)
        p = predict(RunSpec(model, st, "bf16-mixed", default_knobs(st), 1, b), 8, 8, dev)
        return f"{p.peak_bytes / GIB:.1f} / {p.required_bytes / GIB:.1f} {'fits' if p.fits else '**OOM**'} (max {p.max_batch or '-'})"

    out = [row(["model", "device", "local batch", "AC", "fsdp-full: peak / required GiB", "fsdp2-full: peak / required GiB"]),
           row(["---"] * 6)]
    for model, dev, b in FSDP2_CASES:
        for ac in ("", "-ac"):
            out.append(row([model, f"8 × {dev}", str(b), "yes" if ac else "no",
                             *(cell(model, f"{w}-full{ac}", dev, b) for w in ("fsdp", "fsdp2"))]))
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(fsdp2_table() if sys.argv[1:] == ["--fsdp2"] else tables())


# What the seeds said fits where, held against the fits table (planner/fits.py, `plan --fits-table`).
@dataclass(frozen=True)
class SeedClaim:
    """What a seed said fits, on one machine shape: the models of ``models`` that ``fit`` (the
    rest do not) under each of ``strategies`` at each local batch of ``batches``. Worded and
    recomputed in docs/planner.md, "Seed claims, recomputed" (planner/seeds.py, tests/test_plan.py)."""

    seed: str
    claim: str
    device: str
    world: int
    strategies: tuple[str, ...]
    models: tuple[str, ...]
    fit: frozenset[str]
    batches: tuple[int, ...]
    precision: str = "bf16-mixed"


_FLAVA = ("flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b")
_VIT = ("vit-3b", "vit-5b", "vit-15b")
# The FLAVA seed: 8 x A100 40GB, its Figure 1 at local batch 8, "could not be trained" read at batch 1 too.
# FSDP + AC was reentrant in its code: the runner's fsdp-full-ac-reentrant is that rung, fsdp-full-ac is not.
# The ViT seed: local batch 32, AC on (ORNL's default); its "HYBRID over g GCDs" on g ranks shards over all
# of them, as fsdp-full-ac does on a world of g.
SEED_CLAIMS = (
    SeedClaim("FLAVA seed", "DDP fits 350M and 900M only", "a100-40gb", 8, ("ddp",), _FLAVA, frozenset(_FLAVA[:2]), (1, 8)),
    SeedClaim("FLAVA seed", "FSDP adds 1.8B and 2.7B", "a100-40gb", 8, ("fsdp-full",), _FLAVA, frozenset(_FLAVA[:4]), (1, 8)),
    SeedClaim("FLAVA seed", "FSDP + AC reaches 4.8B and 10B", "a100-40gb", 8, ("fsdp-full-ac", "fsdp-full-ac-reentrant"),
              _FLAVA, frozenset(_FLAVA), (1, 8)),
    SeedClaim("ViT seed", "ViT-3B fits one GCD; 5B needs sharding over 2", "mi250x-gcd", 1, ("fsdp-full-ac",), _VIT,
              frozenset(_VIT[:1]), (32,)),
    SeedClaim("ViT seed", "ViT-15B needs 4 GCDs", "mi250x-gcd", 2, ("fsdp-full-ac",), _VIT, frozenset(_VIT[:2]), (32,)),
    SeedClaim("ViT seed", "ViT-15B needs 4 GCDs", "mi250x-gcd", 4, ("fsdp-full-ac",), _VIT, frozenset(_VIT), (32,)),
)
