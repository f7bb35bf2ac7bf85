"""A strategy applied in one process (rung/parallelize.py): proof that wrapping happened (a
wrong layer class is an error) for FSDP1 and FSDP2, compiled blocks, FSDP2's prefetch lists and how it gathers
FLAVA's repeated encoder passes, and a meta-device build that keeps the codebook weights
it was given."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
from torch import nn

from helpers.gloo import one_rank_group
from scaleladder.flavors import get_flavor
from scaleladder.models.build import build_model
from scaleladder.rung import parallelize
from scaleladder.rung.parallelize import apply_strategy
from scaleladder.rung.precision import policy
from scaleladder.rung.what_ran import sharding_ran
from scaleladder.spec import SpecError, default_knobs, parse_knobs, parse_strategy

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def group():  # type: ignore[no-untyped-def]
    with one_rank_group():
        yield


def _wrong_layer_cls(flavor: str) -> type[nn.Module]:
    # The two torchmultimodal classes both named TransformerEncoderLayer, each the wrong
    # one for the other family (FLAVA's trap is the first: the class the blog names).
    if flavor.startswith("flava"):
        from torchmultimodal.modules.layers.transformer import TransformerEncoderLayer
    else:
        from torchmultimodal.models.flava.transformer import TransformerEncoderLayer
    return TransformerEncoderLayer


def _apply(flavor: str, strategy: str, model: nn.Module | None = None, knobs: str | None = None,
            backend: str = "aot_eager") -> tuple[nn.Module, parallelize.WrapReport]:
    # aot_eager: these tests look at structure, not kernels; inductor's code generation
    # would add tens of seconds per compiled case on the CPU (tests/test_parity.py runs it).
    torch.manual_seed(0)
    model = model if model is not None else build_model(get_flavor(flavor))
    s = parse_strategy(strategy)
    return apply_strategy(model, s, parse_knobs(knobs) if knobs else default_knobs(s), policy("fp32"), CPU,  # type: ignore[arg-type]
                          compile_backend=backend)


@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-grad-op-ac", "ddp-ac", "fsdp2-full", "fsdp2-grad-op-ac",
                                      "single-compile"])
@pytest.mark.parametrize("flavor", ["vit-debug", "flava-debug"])
def test_a_wrong_layer_class_is_an_error(flavor: str, strategy: str) -> None:
    # FLAVA under plain FSDP is the case a unit count misses: root + the codebook's own
    # unit make 2 units even when no transformer layer is wrapped.
    model = build_model(get_flavor(flavor))
    model.layer_cls = _wrong_layer_cls(flavor)
    with pytest.raises(SpecError, match="wrong layer class") as e:
        _apply(flavor, strategy, model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp2-full"])
@pytest.mark.parametrize("flavor", ["vit-debug", "flava-debug"])
def test_a_policy_that_misses_the_layers_is_an_error(flavor: str, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The right class, but a policy that gives layers no unit (FLAVA still gets 2 units;
    # ViT, with nothing else to wrap, gets LayerNorm units instead).
    real = parallelize._unit_classes
    monkeypatch.setattr(parallelize, "_unit_classes", lambda m, ac: {c for c in real(m, ac) if c is not m.layer_cls} or {nn.LayerNorm})
    with pytest.raises(SpecError, match=r"gave 0 of the \d+ .*TransformerEncoderLayer"):
        _apply(flavor, strategy)


@pytest.mark.parametrize("flavor,layers,other_units", [("vit-debug", 2, 1), ("flava-debug", 5, 2)])
@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-hybrid1-ac", "fsdp-full-ac-reentrant", "fsdp2-full", "fsdp2-hybrid1-ac",
                                      "fsdp2-grad-op-ac-compile"])
def test_every_layer_gets_its_own_unit_and_the_count_is_reported(flavor: str, layers: int, other_units: int, strategy: str) -> None:
    wrapped, report = _apply(flavor, strategy)
    if strategy.startswith("fsdp-") and "-ac" in strategy:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, CheckpointWrapper
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # Non-reentrant: FSDP(CheckpointWrapper(layer)). Reentrant, the seed's nesting: the unit
        # INSIDE the wrapper, CheckpointWrapper(FSDP(layer)), so each recompute gathers it again.
        wrappers = [m for m in wrapped.modules() if isinstance(m, CheckpointWrapper)]
        assert len(wrappers) == layers
        reentrant = strategy.endswith("-reentrant")
        for w in wrappers:
            assert isinstance(w._checkpoint_wrapped_module, FSDP) == reentrant
            assert w.checkpoint_impl == (CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT)
    assert report.fsdp_layer_units == layers  # root (+ FLAVA's codebook) are the other units
    # FSDP1: + FLAVA's 5 unused heads and poolers, each a frozen unit (one FlatParameter each)
    frozen_units = 5 if flavor == "flava-debug" and strategy.startswith("fsdp-") else 0
    assert report.fsdp_units == layers + other_units + frozen_units
    assert report.ac_layers == (layers if "-ac" in strategy else 0)
    assert report.compiled_layers == (layers if strategy.endswith("-compile") else 0)
    assert report.compile_backend == ("aot_eager" if strategy.endswith("-compile") else "")
    if strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        # FSDP2 swaps each unit's class and turns every parameter into a DTensor: the root too
        # (without fully_shard on the root its own parameters would never be reduced).
        assert isinstance(wrapped, FSDPModule)
        assert all(isinstance(p, DTensor) for p in wrapped.parameters())


@pytest.mark.parametrize("strategy", ["single-compile", "ddp-ac-compile", "fsdp2-full-ac-compile"])
def test_compile_wraps_each_block_after_ac_and_before_the_wrapper(strategy: str) -> None:
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrapped, report = _apply("flava-debug", strategy)
    blocks = [m for m in wrapped.modules() if isinstance(m, OptimizedModule)]
    assert len(blocks) == report.compiled_layers == 5
    # AC, then compile: the compiled module is the checkpoint wrapper, not the bare layer
    ac = "-ac" in strategy
    assert all(isinstance(b._orig_mod, CheckpointWrapper) == ac for b in blocks)
    if strategy.startswith("fsdp2"):
        from torch.distributed.fsdp import FSDPModule

        assert all(isinstance(b, FSDPModule) for b in blocks)  # then shard: the unit is the compiled block


@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-no-shard-sac", "fsdp-full-ac-reentrant"])
def test_fsdp1_flat_parameters_as_the_seed_ran_them(strategy: str) -> None:
    """use_orig_params=False (the FLAVA seed's default; -ac-reentrant excepted, planner.static):
    the optimizer is handed one FlatParameter per unit, and each unit's parameters are all
    trainable or all frozen, FLAVA's unused heads and poolers in units of their own."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._flat_param import FlatParameter

    wrapped, _ = _apply("flava-debug", strategy)
    units = [m for m in wrapped.modules() if isinstance(m, FSDP)]
    orig = strategy.endswith("-reentrant")
    assert all(u._use_orig_params == orig for u in units)
    assert all(isinstance(p, FlatParameter) for p in wrapped.parameters()) != orig
    frozen = {n.replace("_fsdp_wrapped_module.", "") for n, m in wrapped.named_modules()
              if isinstance(m, FSDP) and m._handle is not None and not m._handle.flat_param.requires_grad}
    assert frozen == {"flava.image_codebook", "flava.loss.mlm_loss", "flava.loss.mim_loss",
                      *(f"flava.model.{e}_encoder.pooler" for e in ("image", "text", "mm"))}


def test_fsdp1_is_never_compiled() -> None:
    with pytest.raises(SpecError, match="not offered with FSDP1.*fsdp2-full-compile") as e:
        parse_strategy("fsdp-full-compile")
    assert "\n" not in str(e.value)


def test_a_disabled_dynamo_is_refused_not_run_eager() -> None:
    # TRAP (tests): not monkeypatch.setattr — Dynamo's config module serves its keys through
    # __getattr__, and monkeypatch's undo then DELETES the key for the rest of the session.
    with torch._dynamo.config.patch(disable=True), pytest.raises(SpecError, match="TORCH_COMPILE_DISABLE"):
        _apply("vit-debug", "single-compile")


def test_a_graph_break_is_a_one_line_compile_error() -> None:
    """fullgraph=True: a block Dynamo cannot capture whole fails the rung at its first step,
    in one line, instead of running partly eager under a compiled label."""
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.loop import CompileError, train_loop

    flavor = get_flavor("vit-debug")
    torch.manual_seed(0)
    model = build_model(flavor)
    for layer in [m for m in model.modules() if isinstance(m, model.layer_cls)]:
        real = layer.forward

        def broken(*a: object, _real=real, **k: object) -> object:
            torch._dynamo.graph_break()
            return _real(*a, **k)

        layer.forward = broken  # type: ignore[method-assign]
    wrapped, _ = _apply("vit-debug", "single-compile", model)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    with pytest.raises(CompileError, match="failed to compile at step 0") as e:
        train_loop(wrapped, opt, SyntheticBatches(flavor, 2, 0, 2, 0, CPU), steps=2, warmup=1, prec=policy("fp32"), device=CPU, compiled=True)
    assert "\n" not in str(e.value)


def test_a_recompile_inside_the_window_is_an_error() -> None:
    """Compile time must never enter the throughput: a shape change after the warm-up makes
    Dynamo recompile, which the window refuses."""
    from scaleladder.rung.loop import CompileError, train_loop

    flavor = get_flavor("vit-debug")
    wrapped, _ = _apply("vit-debug", "single-compile")
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    from scaleladder.rung.batches import synthetic_batch

    # the measured step gets a batch of another size than the warm-up's: a new graph
    batches = [synthetic_batch(flavor, 2, 0, 0, 0), synthetic_batch(flavor, 3, 0, 1, 0)]
    with pytest.raises(CompileError, match="recompiled inside the measured window at step 1"):
        train_loop(wrapped, opt, batches, steps=2, warmup=1, prec=policy("fp32"), device=CPU, compiled=True)
    assert torch._dynamo.config.error_on_recompile is False  # the window's rule does not outlive it


def test_a_compiled_loop_needs_a_warmup_and_records_its_compile() -> None:
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.loop import CompileError, train_loop

    flavor = get_flavor("vit-debug")
    wrapped, _ = _apply("vit-debug", "single-compile")
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    with pytest.raises(CompileError, match="warmup >= 1"):
        train_loop(wrapped, opt, SyntheticBatches(flavor, 2, 0, 3, 0, CPU), steps=3, warmup=0, prec=policy("fp32"), device=CPU, compiled=True)
    m = train_loop(wrapped, opt, SyntheticBatches(flavor, 2, 0, 4, 0, CPU), steps=4, warmup=1, prec=policy("fp32"), device=CPU, compiled=True)
    assert m.compile_graphs >= 1
    # the definition (rung/loop.py, docs/metrics.md), from the step times it keeps
    assert m.compile_s == pytest.approx(m.step_time_s[0] - np.median(m.step_time_s[1:]))


# -- FSDP2: explicit prefetch, and FLAVA's repeated passes ----------------------------------


def _names(wrapped: nn.Module, targets: list[nn.Module]) -> list[str]:
    names = {id(m): n for n, m in wrapped.named_modules()}
    return [names[id(t)] for t in targets]


def test_fsdp2_prefetch_stays_within_each_encoder() -> None:
    """pf2 on FLAVA: each layer names the next two layers of ITS encoder for forward and the
    previous two (nearest first) for backward; nothing crosses encoders, whose order
    differs between FLAVA's two passes; pf0 sets nothing (FSDP2's implicit prefetch)."""
    wrapped, _ = _apply("flava-debug", "fsdp2-full", knobs="pf2")
    layers = {n: m for n, m in wrapped.named_modules() if isinstance(m, wrapped.layer_cls)}  # type: ignore[arg-type]
    state = {n: m._get_fsdp_state() for n, m in layers.items()}  # type: ignore[operator]

    def targets(name: str, which: str) -> list[str]:
        return [s._modules[0] for s in getattr(state[name], f"_states_to_{which}_prefetch")]

    img = "flava.model.image_encoder.encoder.layer."
    assert _names(wrapped, targets(img + "0", "forward")) == [img + "1"]  # ViT/FLAVA-debug stacks hold 2 layers
    assert targets(img + "0", "backward") == []  # the first of its stack: FSDP2's implicit backward prefetch stays on
    assert _names(wrapped, targets(img + "1", "backward")) == [img + "0"]
    assert targets(img + "1", "forward") == []  # the last of its stack: never the text encoder's first
    assert targets("flava.model.mm_encoder.encoder.layer.0", "forward") == []
    plain, _ = _apply("vit-debug", "fsdp2-full")
    assert all(not m._get_fsdp_state()._states_to_forward_prefetch and not m._get_fsdp_state()._states_to_backward_prefetch
               for m in plain.modules() if isinstance(m, plain.layer_cls))  # type: ignore[arg-type,union-attr]
    vit2, _ = _apply("vit-debug", "fsdp2-full", knobs="pf2")
    first = next(m for m in vit2.modules() if isinstance(m, vit2.layer_cls))  # type: ignore[arg-type]
    assert len(first._get_fsdp_state()._states_to_forward_prefetch) == 1  # ViT-debug has 2 layers: one ahead


def _fsdp2_gathers(strategy: str) -> tuple[dict[str, int], int]:
    """One FLAVA step under FSDP2 on one rank: (unshards per unit, max units gathered when
    a layer's backward starts). fully_shard tracks a unit's state on one rank too."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as pg
    from torch.distributed.fsdp import FSDPModule

    from scaleladder.rung.batches import synthetic_batch

    wrapped, _ = _apply("flava-debug", strategy)
    groups = [m._get_fsdp_state()._fsdp_param_group for m in wrapped.modules() if isinstance(m, FSDPModule)]
    unshards: dict[str, int] = {}
    real = pg.FSDPParamGroup._to_unsharded

    def counted(self: pg.FSDPParamGroup) -> None:
        if not self.is_unsharded:
            unshards[self._module_fqn] = unshards.get(self._module_fqn, 0) + 1
        real(self)

    seen: list[int] = []
    for m in wrapped.modules():
        if isinstance(m, wrapped.layer_cls):  # type: ignore[arg-type]
            m.register_full_backward_pre_hook(lambda *_: seen.append(sum(g.is_unsharded for g in groups)))
    pg.FSDPParamGroup._to_unsharded = counted  # type: ignore[method-assign]
    try:
        wrapped(synthetic_batch(get_flavor("flava-debug"), 10, 0, 0, 0)).backward()
    finally:
        pg.FSDPParamGroup._to_unsharded = real  # type: ignore[method-assign]
    assert not any(g.is_unsharded for g in groups)  # all resharded after backward
    return unshards, max(seen)


@pytest.mark.parametrize("strategy", ["fsdp2-full", "fsdp2-full-ac"])
def test_fsdp2_reshards_flava_layers_between_the_two_passes(strategy: str) -> None:
    """docs/strategies.md, "FLAVA's repeated passes under FSDP2". FSDP1 keeps every image and
    text unit gathered from the masked pass's backward to the unmasked one's (1 + 2 x layers
    units at once, tests/test_plan_exact.py). FSDP2 reshards a unit after each pass's
    backward and gathers it again for the other: each image/text layer is gathered 4 times
    a step (2 forward, 2 backward), the multimodal layer 2, the root once; when a layer's
    backward starts only the root (and, under AC, the layer itself) is gathered."""
    unshards, most = _fsdp2_gathers(strategy)
    layers = {k: v for k, v in unshards.items() if ".encoder.layer." in k}
    assert {k: v for k, v in layers.items() if "mm_encoder" not in k} == {
        f"flava.model.{e}_encoder.encoder.layer.{i}": 4 for e in ("image", "text") for i in range(2)}
    assert layers["flava.model.mm_encoder.encoder.layer.0"] == 2
    assert unshards[""] == 1  # the root: gathered once, kept from forward into backward
    assert most <= 2


def test_fsdp2_grad_op_keeps_units_gathered_through_the_forward() -> None:
    unshards, most = _fsdp2_gathers("fsdp2-grad-op")
    # gathered once in forward (both passes) and again after the first pass's backward resharded it
    assert unshards["flava.model.image_encoder.encoder.layer.0"] == 2
    assert most == 7  # root + codebook + 5 layers: everything stays gathered from forward


# -- --init meta with --codebook-weights -------------------------------------------------


def _cfg(tmp_path: Path, strategy: str, weights: Path) -> object:
    from scaleladder.rung.run_config import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    knobs = default_knobs(parse_strategy(strategy))
    a = p.parse_args(["--spec", f"flava-debug/{strategy}/fp32/{knobs}/n1/b10", "--out", str(tmp_path / "r.h5"),
                      "--init", "meta", "--codebook-weights", str(weights), "--seed", "3"])
    return config_from_args(a)


def _codebook_params(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    """The DALL-E encoder's parameters after wrapping, under their state-dict names."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor

    marker = "image_codebook.encoder."
    ctx = FSDP.summon_full_params(wrapped) if isinstance(wrapped, FSDP) else torch.no_grad()
    with ctx:  # FSDP2: each parameter is a DTensor; full_tensor() gathers it
        return {n[n.index(marker) + len(marker):]: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in wrapped.named_parameters() if marker in n}


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp-full", "fsdp-full-ac", "fsdp2-full", "fsdp2-full-ac"])
def test_meta_init_loads_the_codebook_weights(tmp_path: Path, strategy: str) -> None:
    from scaleladder.rung.run import build_wrapped

    torch.manual_seed(123)  # weights no seeded init of the run would give
    saved = {k: v.clone() for k, v in build_model(get_flavor("flava-debug")).flava.image_codebook.encoder.state_dict().items()}
    weights = tmp_path / "dalle.pt"
    torch.save(saved, weights)
    wrapped, report, params = build_wrapped(_cfg(tmp_path, strategy, weights), "meta", CPU, policy("fp32"))  # type: ignore[arg-type]
    got = _codebook_params(wrapped)
    assert set(got) == set(saved)  # the encoder has parameters only: every one is checked
    for k, v in got.items():
        assert torch.equal(v, saved[k]), f"{strategy}: {k} is not the file's"
    assert not any(p.is_meta for p in wrapped.parameters())
    assert params > 0 and (report.fsdp_layer_units == 5) == strategy.startswith("fsdp")


def test_meta_init_rejects_a_codebook_file_that_does_not_fit(tmp_path: Path) -> None:
    from scaleladder.rung.run import build_wrapped

    bad = tmp_path / "bad.pt"
    torch.save({"blocks.input.w": torch.zeros(1)}, bad)
    with pytest.raises(SpecError, match="bad.pt"):
        build_wrapped(_cfg(tmp_path, "fsdp-full", bad), "meta", CPU, policy("fp32"))  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy,ran", [
    # FSDP1 on one rank replaces FULL_SHARD / SHARD_GRAD_OP by NO_SHARD (a warning only)
    ("fsdp-full", "fsdp1:NO_SHARD"), ("fsdp-grad-op-ac", "fsdp1:NO_SHARD"), ("fsdp-no-shard", "fsdp1:NO_SHARD"),
    # FSDP2 keeps its schedule on a one-rank mesh, sharded over 1 rank
    ("fsdp2-full", "fsdp2:shard1:reshard"), ("fsdp2-grad-op", "fsdp2:shard1:keep"),
    ("fsdp2-hybrid1", "fsdp2:shard1xreplicate1:reshard"),
    ("single", "none"), ("ddp", "ddp"),
])
def test_the_record_says_what_sharding_ran_not_what_the_spec_asked(strategy: str, ran: str) -> None:
    wrapped, _ = _apply("vit-debug", strategy)
    got = sharding_ran(wrapped)
    assert got == {"sharding_ran": ran, "param_shard_fraction": 1.0}, got


# -- the optimizer over FSDP2's shards -----------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_fsdp2_optimizer_steps_the_local_shards_as_adamw_steps_the_dtensors(precision: str) -> None:
    """rung.optim.LocalShardAdamW (no DTensor dispatch in the step) updates FSDP2's parameters
    exactly as fused AdamW over the DTensors does; fp16-mixed keeps the DTensors (its scaler's
    inf check must be a MAX over the mesh)."""
    from torch.distributed.tensor import DTensor

    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.optim import LocalShardAdamW, make_optimizer

    flavor, prec = get_flavor("vit-debug"), policy(precision)
    runs = []
    for local in (True, False):
        wrapped, _ = _apply("vit-debug", "fsdp2-full")
        params = [p for p in wrapped.parameters() if p.requires_grad]
        opt = make_optimizer(params, 1e-3, precision) if local else torch.optim.AdamW(params, lr=1e-3, fused=True)
        assert isinstance(opt, LocalShardAdamW) == local
        losses = []
        for step in range(3):
            with prec.autocast(CPU):
                loss = wrapped(synthetic_batch(flavor, 4, 0, step, 0))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        runs.append((losses, [p.to_local().clone() for p in params]))
        assert all(isinstance(p, DTensor) for p in params)
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert not isinstance(make_optimizer(params, 1e-3, "fp16-mixed"), LocalShardAdamW)
