"""The ladder in one process: proof that wrapping happened (a wrong layer class is an
error), and a meta-device build that keeps the codebook weights it was given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.gloo import one_rank_group
from scaleladder.rung import ladder
from scaleladder.models.build import build_model
from scaleladder.models.flavors import get_flavor
from scaleladder.rung.ladder import apply_strategy
from scaleladder.rung.precision import policy
from scaleladder.spec import Knobs, SpecError, parse_strategy

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


def _ladder(flavor: str, strategy: str, model: nn.Module | None = None) -> tuple[nn.Module, ladder.LadderReport]:
    torch.manual_seed(0)
    model = model if model is not None else build_model(get_flavor(flavor))
    return apply_strategy(model, parse_strategy(strategy), Knobs(), policy("fp32"), CPU)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-grad-op-ac", "ddp-ac"])
@pytest.mark.parametrize("flavor", ["vit-debug", "flava-debug"])
def test_a_wrong_layer_class_is_an_error(flavor: str, strategy: str) -> None:
    # FLAVA under plain FSDP is the case a unit count misses: root + the codebook's own
    # unit make 2 units even when no transformer layer is wrapped.
    model = build_model(get_flavor(flavor))
    model.layer_cls = _wrong_layer_cls(flavor)
    with pytest.raises(SpecError, match="wrong layer class") as e:
        _ladder(flavor, strategy, model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("flavor", ["vit-debug", "flava-debug"])
def test_a_policy_that_misses_the_layers_is_an_error(flavor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The right class, but a policy that gives layers no unit (FLAVA still gets 2 units;
    # ViT, with nothing else to wrap, gets LayerNorm units instead).
    real = ladder._unit_classes
    monkeypatch.setattr(ladder, "_unit_classes", lambda m, ac: {c for c in real(m, ac) if c is not m.layer_cls} or {nn.LayerNorm})
    with pytest.raises(SpecError, match=r"gave 0 of the \d+ .*TransformerEncoderLayer"):
        _ladder(flavor, "fsdp-full")


@pytest.mark.parametrize("flavor,layers,other_units", [("vit-debug", 2, 1), ("flava-debug", 5, 2)])
@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-hybrid1-ac"])
def test_every_layer_gets_its_own_unit_and_the_count_is_reported(flavor: str, layers: int, other_units: int, strategy: str) -> None:
    _, report = _ladder(flavor, strategy)
    assert report.fsdp_layer_units == layers  # root (+ FLAVA's codebook) are the other units
    assert report.fsdp_units == layers + other_units
    assert report.ac_layers == (layers if strategy.endswith("-ac") else 0)


# -- --init meta with --codebook-weights -------------------------------------------------


def _cfg(tmp_path: Path, strategy: str, weights: Path) -> object:
    from scaleladder.rung.run import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--spec", f"flava-debug/{strategy}/fp32/pre-lag/n1/b10", "--out", str(tmp_path / "r.h5"),
                      "--init", "meta", "--codebook-weights", str(weights), "--seed", "3"])
    return config_from_args(a)


def _codebook_params(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    """The DALL-E encoder's parameters after wrapping, under their state-dict names."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    marker = "image_codebook.encoder."
    ctx = FSDP.summon_full_params(wrapped) if isinstance(wrapped, FSDP) else torch.no_grad()
    with ctx:
        return {n[n.index(marker) + len(marker):]: p.detach().clone() for n, p in wrapped.named_parameters() if marker in n}


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp-full", "fsdp-full-ac"])
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
