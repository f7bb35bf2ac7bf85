from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scaleladder.rung.batches import masked_counts, synthetic_batch
from scaleladder.models.build import build_model, count_parameters
from scaleladder.models.flavors import FLAVORS, get_flavor
from scaleladder.models.flops import flava_flops, vit_flops
from scaleladder.models.init import materialize
from scaleladder.models.table import row
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
