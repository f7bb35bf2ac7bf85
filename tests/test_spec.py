from __future__ import annotations

import pytest

from scaleladder.spec import RunSpec, SpecError, parse_batch, parse_knobs, parse_strategy

NAMES = ["single", "ddp", "ddp-ac", "fsdp-full", "fsdp-grad-op-ac", "fsdp-no-shard", "fsdp-hybrid1", "fsdp-hybrid2-ac", "fsdp-hybrid8"]


@pytest.mark.parametrize("name", NAMES)
def test_strategy_names_round_trip(name: str) -> None:
    assert str(parse_strategy(name)) == name


def test_strategy_fields() -> None:
    s = parse_strategy("fsdp-hybrid2-ac")
    assert (s.wrapper, s.sharding, s.group, s.ac) == ("fsdp", "hybrid", 2, True)
    assert parse_strategy("ddp").sharding is None


@pytest.mark.parametrize("knobs", ["pre-lag", "post-nolag", "none-lag-fwd", "pre-nolag-fwd"])
def test_knobs_round_trip(knobs: str) -> None:
    assert str(parse_knobs(knobs)) == knobs


def test_spec_path_round_trips() -> None:
    path = "vit-base/fsdp-hybrid2-ac/bf16-mixed/post-nolag/n4/b32"
    spec = RunSpec.from_path(path)
    assert spec.path == path
    assert RunSpec.from_path("results/rungs/" + path + ".h5") == spec
    assert spec.as_attrs()["hybrid_group"] == 2 and spec.as_attrs()["knob_limit_all_gathers"] is False


@pytest.mark.parametrize(
    "path,culprit",
    [
        ("vit-bogus/ddp/fp32/pre-lag/n1/b8", "vit-bogus"),
        ("vit-base/zero3/fp32/pre-lag/n1/b8", "zero3"),
        ("vit-base/ddp/fp8/pre-lag/n1/b8", "fp8"),
        ("vit-base/fsdp-full/fp32/early-lag/n1/b8", "early-lag"),
        ("vit-base/ddp/fp32/post-lag/n1/b8", "post-lag"),  # knobs on a non-FSDP strategy
        ("vit-base/ddp/fp32/pre-lag/n0/b8", "nodes"),
        ("vit-base/ddp/fp32/pre-lag/n1/b0", "batch"),
        ("vit-base/ddp/fp32/pre-lag/n1/b-3", "batch"),
        ("vit-base/fsdp-hybrid0/fp32/pre-lag/n1/b8", "hybrid"),
        ("vit-base/ddp", "model/strategy"),
    ],
)
def test_bad_specs_name_the_culprit(path: str, culprit: str) -> None:
    with pytest.raises(SpecError, match=culprit) as e:
        RunSpec.from_path(path)
    assert "\n" not in str(e.value)


def test_world_checks() -> None:
    with pytest.raises(SpecError, match="does not divide"):
        parse_strategy("fsdp-hybrid3").check_world(4)
    with pytest.raises(SpecError, match="one process"):
        parse_strategy("single").check_world(2)
    parse_strategy("fsdp-hybrid2").check_world(8)


def test_batch_max() -> None:
    assert parse_batch("max") == "max" and parse_batch("16") == 16
