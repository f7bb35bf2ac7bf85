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


@pytest.mark.parametrize(
    "name,canonical",
    [("fsdp-hybrid02", "fsdp-hybrid2"), ("fsdp-hybrid002-ac", "fsdp-hybrid2-ac"), ("fsdp-hybrid\u0662", "fsdp-hybrid2")],
)
def test_non_canonical_strategies_are_rejected_with_the_canonical_form(name: str, canonical: str) -> None:
    # int() reads "02" and the Arabic-Indic "٢" as 2: accepted, they would name a second file for the same run.
    with pytest.raises(SpecError, match=f"{name!r} is not canonical; write {canonical!r}") as e:
        parse_strategy(name)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "path,part,canonical",
    [
        ("vit-base/fsdp-hybrid02/fp32/pre-lag/n1/b8", "fsdp-hybrid02", "fsdp-hybrid2"),
        ("vit-base/ddp/fp32/pre-lag/n01/b8", "n01", "n1"),
        ("vit-base/ddp/fp32/pre-lag/n1/b+8", "b+8", "b8"),
        ("vit-base/ddp/fp32/pre-lag/n1/b08", "b08", "b8"),
        ("vit-base/ddp/fp32/pre-lag/n1/b1_6", "b1_6", "b16"),
        ("vit-base/ddp/fp32/pre-lag/n 1/b8", "n 1", "n1"),
    ],
)
def test_non_canonical_paths_are_rejected_naming_the_part(path: str, part: str, canonical: str) -> None:
    with pytest.raises(SpecError) as e:
        RunSpec.from_path(path)
    msg = str(e.value)
    assert "\n" not in msg and repr(part) in msg and repr(canonical) in msg and "not canonical" in msg


def test_every_accepted_path_round_trips() -> None:
    for path in ["vit-base/fsdp-hybrid16-ac/bf16-mixed/none-nolag-fwd/n12/b128", "flava-debug/single/fp32/pre-lag/n1/bmax"]:
        assert RunSpec.from_path(path).path == path


def test_seed_and_counts_are_checked_by_the_spec_parsers() -> None:
    from scaleladder.spec import parse_nonnegative

    assert parse_nonnegative("seed", "0") == 0 and parse_nonnegative("seed", 7) == 7
    for bad in ("abc", "-1", "1.5", None):
        with pytest.raises(SpecError, match="seed must be an integer >= 0"):
            parse_nonnegative("seed", bad)  # type: ignore[arg-type]
