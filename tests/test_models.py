from __future__ import annotations

import os

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scaleladder.flavors import FLAVORS, get_flavor
from scaleladder.models.batch_layout import masked_counts
from scaleladder.models.build import build_model, count_parameters
from scaleladder.models.flops import flava_flops, vit_flops
from scaleladder.models.init import materialize
from scaleladder.models.table import row
from scaleladder.rung.batches import synthetic_batch
from scaleladder.spec import SpecError

SEEDED = [f for f in FLAVORS.values() if not f.debug]


@pytest.mark.parametrize("flavor", SEEDED, ids=lambda f: f.name)
def test_parameter_counts_match_the_seed_tables(flavor) -> None:
    r = row(flavor)
    if flavor.name == "vit-5b":
        # The seed's own dimensions (1792 x 56 x MLP 15360) give 3.8B, not its 5349M (docs/models.md).
        assert 3.7e9 < r.params < 3.9e9
        return
    assert abs(r.deviation_pct) < 2.0, f"{flavor.name}: {r.params:,} vs seed {r.seed}"


def test_flava_counts_include_the_codebook_encoder() -> None:
    m = build_model(get_flavor("flava-350m"), "meta")
    codebook = count_parameters(m.flava.image_codebook)
    assert 53e6 < codebook < 55e6  # the DALL-E encoder, ~54M
    assert codebook < count_parameters(m)


def test_models_command_prints_every_flavor(capsys) -> None:
    from scaleladder.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in FLAVORS:
        assert name in out
    assert "10,198,195,447" in out  # FLAVA-10B, computed on meta


@pytest.mark.parametrize("name,impl", [("vit-debug", "sdpa"), ("flava-debug", "sdpa"), ("flava-debug", "torchmultimodal")])
def test_analytic_flops_agree_with_flop_counter(name: str, impl: str) -> None:
    f = get_flavor(name)
    torch.manual_seed(0)
    model = build_model(f, flava_impl=impl)
    batch = synthetic_batch(f, 10, 0, 0, 0)
    counter = FlopCounterMode(display=False)
    # CPU SDPA kernels are invisible to FlopCounterMode; the math backend shows its matmuls.
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(batch).backward()
    measured = counter.get_total_flops() / 10
    if f.family == "vit":
        analytic = vit_flops(f).model
    else:
        text, patches = masked_counts(f)
        # The sync-free (sdpa) heads run on every token: what ran is HFU's count, not MFU's.
        flops = flava_flops(f, 10, text, patches, float(batch["itm_labels"].float().mean()), heads_on_all_tokens=impl == "sdpa")
        analytic = flops.hardware if impl == "sdpa" else flops.model
        assert flops.hardware > flops.model if impl == "sdpa" else flops.hardware == flops.model
    assert analytic == pytest.approx(measured, rel=0.05)


def test_vit_flops_match_the_published_per_image_figures() -> None:
    assert vit_flops(get_flavor("vit-base")).model / 1e9 == pytest.approx(105, rel=0.01)
    assert vit_flops(get_flavor("vit-huge")).model / 1e9 == pytest.approx(1004, rel=0.01)
    f = get_flavor("vit-huge")
    assert vit_flops(f, ac=True).hardware > vit_flops(f).hardware == vit_flops(f).model


def test_codebook_never_downloads_and_loads_a_local_file(tmp_path, monkeypatch) -> None:
    def no_network(*a, **k):
        raise AssertionError("tried to download")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    f = get_flavor("flava-debug")
    torch.manual_seed(1)
    a = build_model(f)
    path = tmp_path / "encoder.pt"
    torch.save(a.flava.image_codebook.encoder.state_dict(), path)
    torch.manual_seed(2)
    b = build_model(f, codebook_weights=path)
    for (n, x), (_, y) in zip(a.flava.image_codebook.named_parameters(), b.flava.image_codebook.named_parameters()):
        assert torch.equal(x, y), n
    assert not any(p.requires_grad for p in b.flava.image_codebook.parameters())


def test_bad_codebook_files_are_named(tmp_path) -> None:
    f = get_flavor("flava-debug")
    with pytest.raises(SpecError, match="missing.pt"):
        build_model(f, codebook_weights=tmp_path / "missing.pt")
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(SpecError, match="corrupt.pt"):
        build_model(f, codebook_weights=bad)
    wrong = tmp_path / "wrong.pt"
    torch.save({"x": torch.zeros(1)}, wrong)
    with pytest.raises(SpecError, match="wrong.pt"):
        build_model(f, codebook_weights=wrong)


def test_logit_scale_is_not_a_scalar() -> None:
    m = build_model(get_flavor("flava-debug"), "meta")
    assert m.flava.loss.contrastive_loss.logit_scale.shape == (1,)  # FSDP1 rejects 0-dim parameters


def test_meta_materialisation_keeps_ties_and_leaves_no_meta() -> None:
    m = build_model(get_flavor("flava-debug"), "meta")
    torch.manual_seed(0)
    materialize(m, torch.device("cpu"))
    assert not any(p.is_meta for p in m.parameters())
    head = m.flava.loss.mmm_loss["mlm"].cls
    assert head.decoder.bias is head.bias  # Module.to_empty would have untied these
    assert torch.isfinite(m(synthetic_batch(get_flavor("flava-debug"), 4, 0, 0, 0)))


# -- FLAVA's two implementations (models/flava_impl.py) -------------------------------------

SYNC_OPS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero", "aten::masked_select"}


def _impls(flavor: str = "flava-debug"):
    f = get_flavor(flavor)
    torch.manual_seed(0)
    original = build_model(f, flava_impl="torchmultimodal")
    torch.manual_seed(0)
    return f, original, build_model(f, flava_impl="sdpa")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max())


def test_sdpa_layers_match_the_package_layers_in_fp32() -> None:
    from scaleladder.models.flava_attention import SdpaLayer

    f, original, fused = _impls()
    assert list(original.state_dict()) == list(fused.state_dict())  # same parameters, same keys
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), fused.state_dict().values()))
    model_o, model_f = original.flava.model, fused.flava.model
    g = torch.Generator().manual_seed(1)
    pad = torch.ones(4, 1, 1, f.text_len)
    pad[..., -5:] = 0  # the package's float mask: 0 = padding
    for enc, t, mask in [("image_encoder", f.patches + 1, None), ("text_encoder", f.text_len, pad), ("mm_encoder", f.patches + 2 + f.text_len, None)]:
        for lo, lf in zip(getattr(model_o, enc).encoder.layer, getattr(model_f, enc).encoder.layer):
            assert type(lf) is SdpaLayer and isinstance(lf, fused.layer_cls)
            x = torch.randn(4, t, f.hidden, generator=g)
            want = lo(x, attention_mask=mask)
            assert _rel(lf(x, attention_mask=mask), want) < 1e-6, enc
            assert _rel(lf(x, attention_mask=None if mask is None else mask != 0), want) < 1e-6, enc  # the boolean form
            weights = lf(x, attention_mask=mask, return_attn_weights=True)  # asked for: the package's path
            assert isinstance(weights, tuple) and weights[1].shape == (4, f.heads, t, t)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
def test_flava_implementations_give_the_same_loss(precision: str) -> None:
    from scaleladder.rung.precision import policy

    f, original, fused = _impls()
    prec = policy(precision)
    batch = {k: v.to(prec.storage_dtype) if v.is_floating_point() else v for k, v in synthetic_batch(f, 10, 0, 0, 0).items()}
    losses = []
    for m in (original, fused):
        m.to(prec.storage_dtype)
        with prec.autocast(torch.device("cpu")):
            loss = m(batch)
        loss.backward()
        losses.append(loss.detach())
    # fp32: the same function in another order (fp32 epsilon 1.2e-7). bf16: one step of bf16's
    # 8-bit mantissa (2^-7) at the loss, where the package's softmax and matmuls round in bf16.
    assert _rel(losses[1], losses[0]) < (1e-6 if precision == "fp32" else 2 ** -6)
    if precision == "fp32":
        grads = [(p.grad, q.grad) for p, q in zip(original.parameters(), fused.parameters())]
        assert all((a is None) == (b is None) for a, b in grads)  # the same parameters get gradients
        scale = max(float(a.abs().max()) for a, _ in grads if a is not None)
        assert max(float((a - b).abs().max()) for a, b in grads if a is not None) < 1e-5 * scale


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
def test_cast_free_layer_norm_is_bitwise_the_package_one(precision: str) -> None:
    from torchmultimodal.modules.layers.normalizations import Fp32LayerNorm

    from scaleladder.models.flava_norm import CastFreeLayerNorm
    from scaleladder.rung.precision import policy

    prec = policy(precision)
    torch.manual_seed(0)
    norm = Fp32LayerNorm(64, eps=1e-12).to(prec.storage_dtype)
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    free = CastFreeLayerNorm(64, eps=1e-12).to(prec.storage_dtype)
    free.load_state_dict(norm.state_dict())
    # fp32 and bf16 inputs: the fp32 residual stream and a bf16 activation (a head's GELU output)
    for x in (torch.randn(8, 64) * 3 + 1, (torch.randn(8, 64) * 3 + 1).bfloat16()):
        x = x.to(prec.storage_dtype) if precision == "bf16-true" else x
        with prec.autocast(torch.device("cpu")):
            want, got = norm(x), free(x)
        assert got.dtype == want.dtype == x.dtype and torch.equal(got, want)


def _top_level_ops(prof) -> tuple[int, int]:
    """(top-level aten ops, sync ops) of a profile: an op inside another aten op is not counted."""
    events = sorted((e for e in prof.events() if e.name.startswith("aten::")), key=lambda e: (e.thread, e.time_range.start, -e.time_range.end))
    top, syncs, open_until = 0, 0, {}
    for e in events:
        if e.time_range.start >= open_until.get(e.thread, -1):
            top += 1
            open_until[e.thread] = e.time_range.end
        syncs += e.name in SYNC_OPS
    return top, syncs


def test_sdpa_flava_step_issues_half_the_ops_and_no_sync() -> None:
    from torch.profiler import ProfilerActivity, profile

    f, original, fused = _impls()
    batch = synthetic_batch(f, 4, 0, 0, 0)
    counts = {}
    for name, m in (("torchmultimodal", original), ("sdpa", fused)):
        m(batch).backward()  # warm: first-call work stays out of the count
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m(batch).backward()
        counts[name] = _top_level_ops(prof)
    # A CPU profile has no cudaStreamSynchronize: syncs are the ops that read a device value on the host.
    assert counts["torchmultimodal"][1] > 0 and counts["sdpa"][1] == 0, counts
    assert counts["sdpa"][0] <= counts["torchmultimodal"][0] / 2, counts


def test_flava_impl_is_checked_before_any_model_and_recorded(tmp_path, capsys) -> None:
    import argparse

    from scaleladder.cli import main
    from scaleladder.rung.run_config import add_arguments, config_from_args

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--spec", "flava-debug/single/fp32/pre-lag/n1/b2", "--flava-impl", "fused", "--out", str(tmp_path / "r.h5")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--flava-impl" in err[0] and "fused" in err[0]
    assert not list(tmp_path.iterdir())
    p = argparse.ArgumentParser()
    add_arguments(p)
    for spec, impl, recorded in [("flava-debug/single/fp32/pre-lag/n1/b2", [], "sdpa"),
                                 ("flava-debug/single/fp32/pre-lag/n1/b2", ["--flava-impl", "torchmultimodal"], "torchmultimodal"),
                                 ("vit-debug/single/fp32/pre-lag/n1/b2", ["--flava-impl", "torchmultimodal"], "")]:
        cfg = config_from_args(p.parse_args(["--spec", spec, "--out", str(tmp_path / "r.h5"), *impl]))
        assert cfg.attrs()["flava_impl"] == recorded
        assert config_from_args(p.parse_args(cfg.argv())).flava_impl == cfg.flava_impl  # launch and maxbatch pass it on


# Opt-in: one flava-350m step on the CPU costs about 3-5 minutes and 5 GB (2-core VM under load,
# 2026-11-27: build 35-55 s and forward+backward 120-200 s per implementation), far over what the
# suite can carry. Measured then: the same loss to the last digit, query-weight gradients within 1.6e-6.
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SCALELADDER_LARGE_TESTS") != "1", reason="flava-350m on the CPU: minutes; SCALELADDER_LARGE_TESTS=1")
def test_flava_350m_step_matches_the_package() -> None:
    f = get_flavor("flava-350m")
    batch = synthetic_batch(f, 1, 0, 0, 0)
    results = []
    for impl in ("torchmultimodal", "sdpa"):
        torch.manual_seed(0)
        m = build_model(f, flava_impl=impl)
        loss = m(batch)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in m.parameters()]))
        del m
    (loss_o, grads_o), (loss_f, grads_f) = results
    assert _rel(loss_f, loss_o) < 1e-6
    assert all((a is None) == (b is None) for a, b in zip(grads_o, grads_f))
    scale = max(float(a.abs().max()) for a in grads_o if a is not None)
    assert max(float((a - b).abs().max()) for a, b in zip(grads_o, grads_f) if a is not None) < 1e-5 * scale
