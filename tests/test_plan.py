"""`scaleladder plan`: the planner's arithmetic, its CLI, and every seed claim recomputed.

Each seed test states the claim, recomputes it from the planner for scaleladder's own
runner, and — where the two disagree — asserts the disagreement AND the mechanism
docs/planner.md names for it (by switching that one mechanism to the seed's code with
``memory.Variant`` and showing the claim comes back). None of these change a constant
to make a seed agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaleladder.cli import main as cli
from scaleladder.plan import DEVICES, fits_table, predict, static_bytes_per_rank
from scaleladder.planner.inventory import inventory
from scaleladder.planner.memory import GIB, Variant, _setup, _simulate, max_batch_for
from scaleladder.planner.inventory import ParamInfo, UnitLayout
from scaleladder.planner.static import Sharding, flat_layout
from scaleladder.spec import Knobs, RunSpec, SpecError, parse_strategy

A100 = "a100-40gb"


def spec(path: str) -> RunSpec:
    return RunSpec.from_path(path)


def max_batch(model: str, strategy: str, device: str, world: int, precision: str = "bf16-mixed",
              variant: Variant = Variant()) -> int | None:
    st = _setup(model, parse_strategy(strategy), precision, Knobs(), world, variant)
    return max_batch_for(st, DEVICES[device])


# -- inventory and static bytes ----------------------------------------------------------------


@pytest.mark.parametrize("model,params", [("flava-350m", 357_645_303), ("flava-10b", 10_198_195_447),
                                          ("vit-5b", 3_807_214_312), ("vit-15b", 14_643_786_520)])
def test_inventory_counts_every_parameter_of_the_full_model(model: str, params: int) -> None:
    # The counts `scaleladder models` prints from a full meta build; the planner builds one layer per encoder.
    assert inventory(model).numel == params


def test_debug_inventories_match_a_full_build_and_the_ladders_frozen_set() -> None:
    from scaleladder.models.build import build_model, count_parameters
    from scaleladder.models.flavors import get_flavor
    from scaleladder.parallel import unused_parameter_names
    from scaleladder.planner.inventory import is_unused

    for name in ("vit-debug", "flava-debug"):
        inv = inventory(name)
        m = build_model(get_flavor(name), "meta")
        assert inv.numel == count_parameters(m)
        frozen = unused_parameter_names(inv.flavor.family)  # found by a real CPU step in parallel.py
        assert {n for n, _ in m.named_parameters() if is_unused(inv.flavor.family, n)} == frozen
        codebook = inv.codebook.numel if inv.codebook else 0
        assert inv.trainable_numel == inv.numel - codebook - sum(p.numel() for n, p in m.named_parameters() if n in frozen)


def test_flat_layout_aligns_each_parameter_and_pads_to_the_group() -> None:
    unit = UnitLayout("layer", tuple(ParamInfo(f"p{i}", n, True, False) for i, n in enumerate([5, 3, 8])))
    lay = flat_layout(unit, aligned_numel=4, pad_to=3)  # fp32: 16 bytes = 4 elements
    assert lay.offsets == (0, 8, 12) and lay.total == 21  # 5 → pad to 8; 3 → 11 → pad to 12; 20 → 21
    lay = flat_layout(unit, aligned_numel=8, pad_to=2)  # bf16 params gathered: 8 elements
    assert lay.offsets == (0, 8, 16) and lay.total == 24
    assert lay.chunk(Sharding("full", 2, 2)) == 12 and lay.chunk(Sharding("no-shard", 1, 2)) == 24


def test_static_bytes_shard_with_the_group_and_keep_dtypes() -> None:
    ddp = static_bytes_per_rank(spec("vit-3b/ddp/bf16-mixed/pre-lag/n1/b8"), 8)
    inv = inventory("vit-3b")
    assert ddp == {"params": 4 * inv.numel, "grads": 4 * inv.trainable_numel, "optimizer": 8 * inv.trainable_numel}
    true = static_bytes_per_rank(spec("vit-3b/ddp/bf16-true/pre-lag/n1/b8"), 8)
    assert true["params"] * 2 == ddp["params"] and true["optimizer"] * 2 == ddp["optimizer"]
    full = static_bytes_per_rank(spec("vit-3b/fsdp-full/bf16-mixed/pre-lag/n1/b8"), 8)
    hyb = static_bytes_per_rank(spec("vit-3b/fsdp-hybrid2/bf16-mixed/pre-lag/n1/b8"), 8)
    noshard = static_bytes_per_rank(spec("vit-3b/fsdp-no-shard/bf16-mixed/pre-lag/n1/b8"), 8)
    for k in ("params", "grads", "optimizer"):
        assert full[k] == pytest.approx(noshard[k] / 8, rel=1e-3)
        assert hyb[k] == pytest.approx(noshard[k] / 2, rel=1e-3)
    assert noshard["params"] >= ddp["params"]  # alignment padding only adds
    with pytest.raises(SpecError, match="does not divide"):
        static_bytes_per_rank(spec("vit-3b/fsdp-hybrid3/bf16-mixed/pre-lag/n1/b8"), 8)


# -- predictions -----------------------------------------------------------------------------------


def test_prediction_is_consistent() -> None:
    s = spec("flava-900m/fsdp-full/bf16-mixed/pre-lag/n1/b8")
    p = predict(s, 8, 8, A100)
    assert sum(v for k, v in p.breakdown.items() if k != "overhead") == pytest.approx(p.peak_bytes, abs=64)
    assert p.required_bytes == p.peak_bytes + p.breakdown["overhead"] and p.fits == (p.required_bytes <= DEVICES[A100])
    at_max = predict(s, 8, 8, A100, batch=p.max_batch)
    over = predict(s, 8, 8, A100, batch=p.max_batch + 1)
    assert at_max.fits and not over.fits
    peaks = [predict(s, 8, 8, A100, batch=b).peak_bytes for b in (1, 2, 4, 8, 16)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    m = predict(spec("flava-900m/fsdp-full/bf16-mixed/pre-lag/n1/bmax"), 8, 8, A100)
    assert m.batch == p.max_batch  # a 'max' spec is predicted at its max batch


def test_more_sharding_and_checkpointing_never_cost_memory() -> None:
    peak = {s: predict(spec(f"vit-1b/{s}/bf16-mixed/pre-lag/n1/b32"), 8, 8, A100).peak_bytes
            for s in ("ddp", "fsdp-no-shard", "fsdp-hybrid2", "fsdp-full", "fsdp-full-ac")}
    assert peak["fsdp-full-ac"] < peak["fsdp-full"] < peak["fsdp-hybrid2"] < peak["fsdp-no-shard"] < peak["ddp"]
    # FULL_SHARD's static part shrinks with the world, DDP's does not
    assert predict(spec("vit-1b/fsdp-full/bf16-mixed/pre-lag/n2/b32"), 16, 8, A100).peak_bytes < peak["fsdp-full"]
    assert predict(spec("vit-1b/ddp/bf16-mixed/pre-lag/n2/b32"), 16, 8, A100).peak_bytes == peak["ddp"]


def test_cpu_is_unlimited_and_unknown_devices_are_refused() -> None:
    p = predict(spec("flava-10b/ddp/fp32/pre-lag/n1/b64"), 1 * 8, 8, "cpu")
    assert p.fits and p.max_batch is None and p.capacity_bytes is None
    assert set(DEVICES) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "mi250x-gcd", "cpu"}
    with pytest.raises(SpecError, match="unknown device 'v100'"):
        predict(spec("vit-base/ddp/fp32/pre-lag/n1/b8"), 8, 8, "v100")


def test_fp32_costs_more_than_bf16_and_bf16_true_least() -> None:
    peaks = {p: predict(spec(f"vit-huge/ddp/{p}/pre-lag/n1/b32"), 8, 8, A100).peak_bytes for p in ("fp32", "bf16-mixed", "bf16-true")}
    assert peaks["bf16-true"] < peaks["bf16-mixed"] < peaks["fp32"]


def test_fits_table_covers_every_model_and_marks_impossible_worlds() -> None:
    cells = fits_table("mi250x-gcd", 1, 8, batch=32, models=["vit-base", "vit-15b"], strategies=("single", "ddp", "fsdp-full-ac"))
    by = {(c.model, c.strategy): c for c in cells}
    assert by[("vit-base", "single")].fits is None  # 'single' cannot run on 8 ranks
    assert by[("vit-base", "ddp")].fits and not by[("vit-15b", "ddp")].fits


# -- the FLAVA seed: 8 × A100 40GB, bf16 autocast + TF32, fixed-size inputs ---------------------------

FLAVA = ["flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b"]
# What the FLAVA seed's train.py did differently, switched on one mechanism at a time:
# REENTRANT checkpointing under FSDP, and MixedPrecision without param_dtype (fp32 all-gathers).
SEED_FLAVA = Variant(gather_across_passes=False, gathered_param_bytes=4)


def fitting(strategy: str, variant: Variant = Variant()) -> list[str]:
    return [m for m in FLAVA if max_batch(m, strategy, A100, 8, variant=variant) is not None]


def test_seed_flava_ddp_fits_350m_and_900m_only() -> None:
    # AGREES: DDP replicates fp32 params, grads, DDP's gradient buckets and AdamW (20 B/param) plus
    # autocast's bf16 weight copies: 1.8B needs ~38 GiB before a single activation.
    assert fitting("ddp") == ["flava-350m", "flava-900m"]


def test_seed_flava_fsdp_adds_1_8b_and_2_7b() -> None:
    # DISAGREES for our runner: it also fits 4.8B, because it gathers parameters in bf16
    # (MixedPrecision param_dtype=bf16). FLAVA runs every encoder layer twice, so FSDP1 keeps
    # each image/text unit gathered, with an unsharded gradient, from the masked pass's backward
    # to the unmasked pass's; gathered in fp32 — as the seed's train.py did — that no longer fits.
    assert fitting("fsdp-full") == FLAVA[:5]
    assert fitting("fsdp-full", SEED_FLAVA) == FLAVA[:4]  # the seed's claim, exactly
    assert fitting("fsdp-full", Variant(gathered_param_bytes=4)) == FLAVA[:4]  # that one switch suffices


def test_seed_flava_fsdp_ac_reaches_4_8b_and_10b() -> None:
    # DISAGREES at 10B for our runner: with non-reentrant checkpointing the double-pass gathering
    # costs 128 layers × 58.7M params × (2 + 2) bytes = 30 GB on top of 20 GB of sharded state.
    # The seed checkpointed REENTRANTLY under FSDP: each checkpoint's nested backward fires FSDP's
    # post-backward hook per pass (torch allows it for exactly this case), so units are resharded
    # between the passes — and 10B fits again.
    assert fitting("fsdp-full-ac") == FLAVA[:5]
    assert fitting("fsdp-full-ac", Variant(gather_across_passes=False)) == FLAVA
    assert fitting("fsdp-full-ac", SEED_FLAVA) == FLAVA


def test_seed_flava_max_batch_ratios_and_10b() -> None:
    # Claims: FSDP+AC ≈ 3× DDP's max batch at 350M, ≈ 5.5× at 900M; 10B reaches ≈ 20.
    # PARTLY AGREES: FSDP+AC multiplies the max batch several times, more so at 900M than at 350M,
    # and 10B lands in the tens under the seed's mechanisms — but our ratios are ~1.6–1.8× the
    # seed's. Our synthetic batches are all image+text pairs with 77 tokens; the seed's loader
    # mixed in text-only MLM batches of 512 tokens (TEXT_MAX_LENGTH_DEFAULT), whose held
    # attention probabilities dominate an AC run's memory. docs/planner.md has the numbers.
    r350 = max_batch("flava-350m", "fsdp-full-ac", A100, 8, variant=SEED_FLAVA) / max_batch("flava-350m", "ddp", A100, 8)
    r900 = max_batch("flava-900m", "fsdp-full-ac", A100, 8, variant=SEED_FLAVA) / max_batch("flava-900m", "ddp", A100, 8)
    assert 3 < r350 < r900 < 2 * 5.5
    ten = max_batch("flava-10b", "fsdp-full-ac", A100, 8, variant=SEED_FLAVA)
    assert ten is not None and 10 <= ten <= 2.5 * 20
    # with 512-token text the seed's 10B figure is bracketed from below
    assert max_batch("flava-10b", "fsdp-full-ac", A100, 8, variant=Variant(False, 4, text_len=512)) < 20 < ten


# -- the ViT seed: MI250X GCDs (64 GB), local batch 32 ------------------------------------------------
# Precision unstated in the seed; we assume bf16-mixed. Its code (ORNL ViT-FSDP) checkpoints every
# block by default (fsdp_activation_checkpointing=True), so "-ac" is the seed's configuration.

GCD = "mi250x-gcd"


def vit_fits(model: str, strategy: str, gcds: int) -> bool:
    return predict(spec(f"{model}/{strategy}/bf16-mixed/pre-lag/n1/b32"), gcds, gcds, GCD).fits


def test_seed_vit_3b_fits_one_gcd() -> None:
    # AGREES: one GCD, no sharding. With AC the step peaks in AdamW (params, grads, two states and
    # foreach's sqrt temporary: 20 B/param = 57 GiB); the seed saw "more than 60 GB" in use.
    assert vit_fits("vit-3b", "fsdp-no-shard-ac", 1)
    p = predict(spec("vit-3b/fsdp-no-shard-ac/bf16-mixed/pre-lag/n1/b32"), 1, 1, GCD)
    assert p.phase == "optimizer" and 50 * GIB < p.peak_bytes < 64 * GIB


def test_seed_vit_5b_needs_two_gcds() -> None:
    # AGREES (with the seed's dimensions, which give 3.8B parameters, not 5.3B).
    assert not vit_fits("vit-5b", "fsdp-no-shard-ac", 1)
    assert vit_fits("vit-5b", "fsdp-hybrid2-ac", 2)


def test_seed_vit_15b_needs_four_gcds() -> None:
    # DISAGREES: our runner needs 8. Sharded over 4, a rank holds 3.66B params; the AdamW step
    # needs fp32 params + grads + 2 states + foreach's sqrt temporary = 20 B/param = 68 GiB > 64.
    # Without the foreach temporary (16 B/param, e.g. the fused AdamW the ORNL code can select)
    # it is 54.5 GiB + activations: it fits on 4.
    assert not vit_fits("vit-15b", "fsdp-hybrid2-ac", 2)
    assert not vit_fits("vit-15b", "fsdp-hybrid4-ac", 4)
    assert vit_fits("vit-15b", "fsdp-hybrid8-ac", 8)
    st = _setup("vit-15b", parse_strategy("fsdp-hybrid4-ac"), "bf16-mixed", Knobs(), 4)
    tl = _simulate(st, 32)
    assert tl.phase == "optimizer"
    without_temp = tl.peak - st.static["optimizer"] / 2
    assert without_temp < DEVICES[GCD] - 2 * GIB


# -- CLI ------------------------------------------------------------------------------------------------


def test_cli_breakdown_json_and_tables(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli(["plan", "--spec", "vit-base/fsdp-full/bf16-mixed/pre-lag/n2/b64", "--device", "h100-80gb",
                "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "on 8 × h100-80gb" in out and "= peak" in out and "max local batch" in out
    assert cli(["plan", "--spec", "vit-base/fsdp-full/bf16-mixed/pre-lag/n2/b64", "--device", "h100-80gb", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world"] == 16 and d["fits"] and set(d["breakdown"]) >= {"params", "grads", "optimizer", "activations", "buffers", "overhead"}
    assert cli(["plan", "--fits-table", "--device", "a100-80gb", "--nodes", "1", "--gpus-per-node", "8",
                "--precision", "bf16-mixed", "--batch", "8"]) == 0
    table = capsys.readouterr().out
    assert "flava-10b" in table and "vit-15b" in table and "fsdp-full-ac" in table
    chart = tmp_path / "fits.png"
    assert cli(["plan", "--fits-chart", str(chart), "--device", "mi250x-gcd", "--nodes", "1", "--gpus-per-node", "8"]) == 0
    assert chart.stat().st_size > 10_000 and chart.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,culprit", [
    (["--spec", "vit-base/ddp/fp32/pre-lag/n1/b8", "--device", "k80"], "unknown device 'k80'"),
    (["--spec", "vit-7b/ddp/fp32/pre-lag/n1/b8", "--device", "cpu"], "unknown model 'vit-7b'"),
    (["--spec", "vit-base/fsdp-hybrid3/fp32/pre-lag/n1/b8", "--device", "cpu"], "does not divide"),
    (["--device", "cpu"], "give --spec"),
    (["--spec", "vit-base/ddp/fp32/pre-lag/n1/b8", "--device", "cpu", "--gpus-per-node", "0"], "gpus-per-node"),
    (["--vs-measured", "x.png", "--device", "cpu", "--rungs", "nope.h5"], "nope.h5"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str], culprit: str) -> None:
    assert cli(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert culprit in err and len(err.splitlines()) == 1


def test_predicted_vs_measured_plot_from_rung_files(tmp_path: Path) -> None:
    from scaleladder.plan_plots import points_from_rungs
    from scaleladder.store import write_record

    ok = tmp_path / "ok.h5"
    write_record(ok, {"status": "ok", "spec": "vit-1b/fsdp-full/bf16-mixed/pre-lag/n1/b32", "batch": "32",
                      "world_size": 8, "ranks_per_node": 8, "peak_active_gib": 20.0})
    write_record(tmp_path / "oom.h5", {"status": "oom", "spec": "vit-1b/ddp/bf16-mixed/pre-lag/n1/b32", "batch": "32"})
    points = points_from_rungs([ok, tmp_path / "oom.h5"], A100)
    assert len(points) == 1 and points[0].measured_gib == 20.0
    assert points[0].predicted_gib * GIB == predict(spec("vit-1b/fsdp-full/bf16-mixed/pre-lag/n1/b32"), 8, 8, A100).peak_bytes
    out = tmp_path / "vs.png"
    assert cli(["plan", "--vs-measured", str(out), "--device", A100, "--rungs", str(ok)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
