from __future__ import annotations

import pytest

from scaleladder.spec import (
    DEFAULT_KNOBS,
    Fsdp2Knobs,
    Knobs,
    RunSpec,
    SpecError,
    Strategy,
    default_knobs,
    parse_batch,
    parse_knobs,
    parse_strategy,
)

NAMES = ["single", "ddp", "ddp-ac", "fsdp-full", "fsdp-grad-op-ac", "fsdp-no-shard", "fsdp-hybrid1", "fsdp-hybrid2-ac", "fsdp-hybrid8",
         "fsdp2-full", "fsdp2-full-ac", "fsdp2-grad-op", "fsdp2-grad-op-ac", "fsdp2-hybrid1", "fsdp2-hybrid2-ac", "fsdp2-hybrid16",
         "single-compile", "single-ac-compile", "ddp-compile", "ddp-ac-compile", "fsdp2-full-compile", "fsdp2-full-ac-compile",
         "fsdp2-grad-op-ac-compile", "fsdp2-hybrid2-ac-compile",
         "single-ac-reentrant", "fsdp-full-ac-reentrant", "fsdp-grad-op-ac-reentrant", "fsdp-hybrid2-ac-reentrant",
         "single-sac", "ddp-sac", "fsdp-full-sac", "fsdp-hybrid2-sac", "fsdp2-full-sac", "fsdp2-hybrid2-sac-compile",
         "single-sac-compile", "ddp-sac-compile"]


@pytest.mark.parametrize("name", NAMES)
def test_strategy_names_round_trip(name: str) -> None:
    assert str(parse_strategy(name)) == name


def test_strategy_fields() -> None:
    s = parse_strategy("fsdp-hybrid2-ac")
    assert (s.wrapper, s.sharding, s.group, s.ac, s.compile) == ("fsdp", "hybrid", 2, True, False)
    assert parse_strategy("ddp").sharding is None
    s2 = parse_strategy("fsdp2-hybrid4-ac-compile")
    assert (s2.wrapper, s2.sharding, s2.group, s2.ac, s2.compile) == ("fsdp2", "hybrid", 4, True, True)
    assert s2.is_fsdp and s2.is_fsdp2 and not s2.is_fsdp1
    assert s.is_fsdp and s.is_fsdp1 and not s.is_fsdp2
    assert not parse_strategy("ddp-compile").is_fsdp and parse_strategy("ddp-compile").compile
    assert parse_strategy("fsdp2-grad-op") == Strategy("fsdp2", "grad-op")  # frozen, comparable, hashable
    r = parse_strategy("fsdp-full-ac-reentrant")
    assert (r.ac, r.reentrant, r.compile) == (True, True, False) and not parse_strategy("fsdp-full-ac").reentrant
    sac = parse_strategy("fsdp2-full-sac-compile")
    assert (sac.ac, sac.selective, sac.reentrant, sac.compile) == (True, True, False, True)
    assert not parse_strategy("fsdp2-full-ac").selective
    assert RunSpec.from_path("vit-base/single-sac/fp32/pre-lag/n1/b8").as_attrs()["ac_selective"] is True
    assert len({parse_strategy(n) for n in NAMES}) == len(NAMES)


@pytest.mark.parametrize("knobs", ["pre-lag", "post-nolag", "none-lag-fwd", "pre-nolag-fwd", "pf0", "pf1", "pf2"])
def test_knobs_round_trip(knobs: str) -> None:
    assert str(parse_knobs(knobs)) == knobs


def test_each_fsdp_generation_has_its_own_knobs_and_default() -> None:
    assert parse_knobs("pf2") == Fsdp2Knobs(2) and isinstance(parse_knobs("pre-lag"), Knobs)
    assert str(default_knobs(parse_strategy("fsdp2-full-ac-compile"))) == "pf0"
    for s in ("single", "ddp-ac", "fsdp-full", "fsdp-hybrid2-ac", "single-compile"):
        assert str(default_knobs(parse_strategy(s))) == DEFAULT_KNOBS
    for path in ("vit-base/fsdp2-full/bf16-mixed/pf0/n1/b8", "vit-base/fsdp2-hybrid2-ac-compile/fp16-mixed/pf2/n2/b8",
                 "vit-base/single-compile/fp32/pre-lag/n1/b8", "vit-base/ddp-ac-compile/fp32/pre-lag/n1/b8"):
        assert RunSpec.from_path(path).path == path
    a = RunSpec.from_path("vit-base/fsdp2-full-ac-compile/bf16-mixed/pf1/n1/b8").as_attrs()
    assert (a["wrapper"], a["sharding"], a["compile"], a["activation_checkpointing"], a["knob_prefetch_layers"]) == \
        ("fsdp2", "full", True, True, 1)
    assert RunSpec.from_path("vit-base/fsdp-full/fp32/pre-lag/n1/b8").as_attrs()["wrapper"] == "fsdp"


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
        # FSDP2 and compile
        ("vit-base/fsdp2-full/fp32/pre-lag/n1/b8", "FSDP1 knobs 'pre-lag' given for FSDP2 strategy 'fsdp2-full'"),
        ("vit-base/fsdp2-full/fp32/post-nolag-fwd/n1/b8", "FSDP1 knobs 'post-nolag-fwd' given for FSDP2"),
        ("vit-base/fsdp-full/fp32/pf1/n1/b8", "FSDP2 knobs 'pf1' given for FSDP1 strategy 'fsdp-full'"),
        ("vit-base/ddp/fp32/pf0/n1/b8", "FSDP knobs 'pf0' given for non-FSDP strategy 'ddp'"),
        ("vit-base/single-compile/fp32/pf0/n1/b8", "non-FSDP strategy 'single-compile'"),
        ("vit-base/fsdp2-full/fp32/pf3/n1/b8", "pf3"),
        ("vit-base/fsdp2-full/fp32/pf/n1/b8", "unknown FSDP knobs 'pf'"),
        ("vit-base/fsdp2-no-shard/fp32/pf0/n1/b8", "FSDP2 has no NO_SHARD"),
        ("vit-base/fsdp2-hybrid0/fp32/pf0/n1/b8", "hybrid group size must be >= 1"),
        ("vit-base/fsdp-full-compile/fp32/pre-lag/n1/b8", "torch.compile is not offered with FSDP1"),
        ("vit-base/fsdp-no-shard-ac-compile/fp32/pre-lag/n1/b8", "use 'ddp-ac-compile'"),
        ("vit-base/fsdp-hybrid2-compile/fp32/pre-lag/n1/b8", "use 'fsdp2-hybrid2-compile'"),
        ("vit-base/ddp-ac-ac/fp32/pre-lag/n1/b8", "repeats '-ac'"),
        # reentrant AC: the FLAVA seed's form, FSDP1 and single only
        ("vit-base/ddp-ac-reentrant/fp32/pre-lag/n1/b8", "Expected to mark a variable ready only once"),
        ("vit-base/fsdp2-full-ac-reentrant/fp32/pf0/n1/b8", "use 'fsdp2-full-ac'"),
        ("vit-base/single-ac-reentrant-compile/fp32/pre-lag/n1/b8", "does not trace reentrant"),
        ("vit-base/fsdp-full-ac-ac-reentrant/fp32/pre-lag/n1/b8", "names '-ac' and '-ac-reentrant'"),
        # selective AC (-sac): one form of AC per rung; under FSDP1 no compile, as -ac
        ("vit-base/ddp-ac-sac/fp32/pre-lag/n1/b8", "names '-ac' and '-sac'"),
        ("vit-base/fsdp-full-sac-ac-reentrant/fp32/pre-lag/n1/b8", "names '-ac-reentrant' and '-sac'"),
        ("vit-base/single-sac-sac/fp32/pre-lag/n1/b8", "repeats '-sac'"),
        ("vit-base/fsdp-full-sac-compile/fp32/pre-lag/n1/b8", "use 'fsdp2-full-sac-compile'"),
        ("vit-base/fsdp-no-shard-sac-compile/fp32/pre-lag/n1/b8", "use 'ddp-sac-compile'"),
        ("vit-base/fsdp2-full-sac/fp32/pre-lag/n1/b8", "FSDP1 knobs 'pre-lag' given for FSDP2 strategy 'fsdp2-full-sac'"),
        ("vit-base/single-sac/fp32/pf1/n1/b8", "non-FSDP strategy 'single-sac'"),
        ("vit-base/ddp-compile-compile/fp32/pre-lag/n1/b8", "repeats '-compile'"),
        ("vit-base/fsdp3-full/fp32/pre-lag/n1/b8", "fsdp2-{full,grad-op,hybrid<g>}"),
        ("vit-base/fsdp2-full-ac-compile-x/fp32/pf0/n1/b8", "unknown strategy"),
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
    [("fsdp-hybrid02", "fsdp-hybrid2"), ("fsdp-hybrid002-ac", "fsdp-hybrid2-ac"), ("fsdp-hybrid\u0662", "fsdp-hybrid2"),
     ("fsdp2-hybrid02-ac", "fsdp2-hybrid2-ac"),
     # the modifiers' one order: base, -ac, -compile
     ("ddp-compile-ac", "ddp-ac-compile"), ("fsdp2-full-compile-ac", "fsdp2-full-ac-compile"),
     ("single-compile-sac", "single-sac-compile")],
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
        ("vit-base/fsdp2-full/fp32/pf01/n1/b8", "pf01", "pf1"),
        ("vit-base/fsdp2-full/fp32/pf\u0661/n1/b8", "pf\u0661", "pf1"),
        ("vit-base/single-compile-ac/fp32/pre-lag/n1/b8", "single-compile-ac", "single-ac-compile"),
    ],
)
def test_non_canonical_paths_are_rejected_naming_the_part(path: str, part: str, canonical: str) -> None:
    with pytest.raises(SpecError) as e:
        RunSpec.from_path(path)
    msg = str(e.value)
    assert "\n" not in msg and repr(part) in msg and repr(canonical) in msg and "not canonical" in msg


def test_every_accepted_path_round_trips() -> None:
    for path in ["vit-base/fsdp-hybrid16-ac/bf16-mixed/none-nolag-fwd/n12/b128", "flava-debug/single/fp32/pre-lag/n1/bmax",
                 "flava-10b/fsdp2-hybrid8-ac-compile/bf16-mixed/pf2/n4/bmax"]:
        assert RunSpec.from_path(path).path == path


def test_seed_and_counts_are_checked_by_the_spec_parsers() -> None:
    from scaleladder.spec import parse_nonnegative

    assert parse_nonnegative("seed", "0") == 0 and parse_nonnegative("seed", 7) == 7
    for bad in ("abc", "-1", "1.5", None):
        with pytest.raises(SpecError, match="seed must be an integer >= 0"):
            parse_nonnegative("seed", bad)  # type: ignore[arg-type]


def test_the_planner_plans_a_compiled_rung_as_its_eager_rung() -> None:
    """A -compile rung's memory is its eager rung's, an upper bound (inductor's
    partitioner saves no more than eager; `plan --json` says so in `memory_model`)."""
    from scaleladder.site.plan import predict, static_bytes_per_rank

    spec = RunSpec.from_path("vit-base/ddp-compile/bf16-mixed/pre-lag/n1/b8")
    eager = RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n1/b8")
    assert predict(spec, 8, 8, "a100-40gb").peak_bytes == predict(eager, 8, 8, "a100-40gb").peak_bytes
    assert static_bytes_per_rank(spec, 8) == static_bytes_per_rank(eager, 8)


def test_bf16_is_read_as_bf16_mixed_said_once_and_never_written(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--precision bf16` and run-spec paths with bf16 are accepted as bf16-mixed; the
    paths, file names and records (as_attrs) keep the canonical name; the console says it once."""
    import argparse

    from scaleladder.rung.run_config import add_arguments, config_from_args
    from scaleladder.spec import RunSpec, canonical_precision, parse_precision

    monkeypatch.delenv("SCALELADDER_PRECISION_ALIAS_SAID", raising=False)
    spec = RunSpec.from_path("vit-debug/single/bf16/pre-lag/n1/b8")
    assert spec.path == "vit-debug/single/bf16-mixed/pre-lag/n1/b8" and spec.as_attrs()["precision"] == "bf16-mixed"
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--model", "vit-debug", "--strategy", "single", "--precision", "bf16", "--batch", "8",
                                         "--steps", "3", "--warmup", "1", "--out", "r.h5"]))
    assert cfg.spec.precision == "bf16-mixed"
    assert parse_precision("bf16-true") == "bf16-true" and canonical_precision("bf15") is None
    err = capsys.readouterr().err
    assert err.count("precision 'bf16' is read as 'bf16-mixed'") == 1, err
    with pytest.raises(SpecError, match=r"unknown precision 'bf15'; expected one of .*, or bf16 \(= bf16-mixed\)"):
        parse_precision("bf15")


# -- the unit size: k blocks per FSDP unit (-u<k>) ---------------------------------------


@pytest.mark.parametrize("knobs", ["pf0-u2", "pf1-u3", "pf2-u12", "pre-lag-u2", "post-nolag-fwd-u4"])
def test_unit_size_knobs_round_trip(knobs: str) -> None:
    assert str(parse_knobs(knobs)) == knobs


def test_a_unit_of_one_block_is_left_out_of_the_path() -> None:
    # k = 1 is the seeds' unit per block: every finished rung's path and record stay as they were
    assert parse_knobs("pf1") == Fsdp2Knobs(1, 1) and str(Fsdp2Knobs(1, 1)) == "pf1"
    assert parse_knobs("pf1-u2") == Fsdp2Knobs(1, 2) and parse_knobs("pf1-u2") != parse_knobs("pf1")
    assert str(Knobs(unit_layers=1)) == "pre-lag"
    one = RunSpec.from_path("vit-base/fsdp2-full/fp32/pf1/n1/b8").as_attrs()
    assert "knob_unit_layers" not in one and "knob_unit_layers" not in RunSpec.from_path(
        "vit-base/fsdp-full/fp32/pre-lag/n1/b8").as_attrs()
    two = RunSpec.from_path("vit-base/fsdp2-full/fp32/pf1-u2/n1/b8")
    assert two.path == "vit-base/fsdp2-full/fp32/pf1-u2/n1/b8" and two.as_attrs()["knob_unit_layers"] == 2
    assert two.as_attrs()["knob_prefetch_layers"] == 1


@pytest.mark.parametrize(
    "path,culprit",
    [
        ("vit-base/ddp/fp32/pre-lag-u2/n1/b8", "knobs 'pre-lag-u2': -u2 puts blocks in FSDP units, and 'ddp' is not FSDP"),
        ("vit-base/single-compile/fp32/pf0-u4/n1/b8", "'single-compile' is not FSDP"),
        ("vit-base/fsdp-full/fp32/pre-lag-u2/n1/b8", "FSDP1 \\('fsdp-full'\\) cannot put 2 blocks in one unit: it has no list API"),
        ("vit-base/fsdp-hybrid2-ac/fp32/post-nolag-u4/n1/b8", "use 'fsdp2-hybrid2-ac' with 'pf0-u4'"),
        ("vit-base/fsdp-no-shard/fp32/pre-lag-u3/n1/b8", "use 'fsdp2-full' with 'pf0-u3'"),
        ("vit-base/fsdp2-full/fp32/pf0-u0/n1/b8", "a unit holds at least 1 block"),
        ("vit-base/fsdp2-full/fp32/pf0-u/n1/b8", "unknown FSDP knobs 'pf0-u'"),
        ("vit-base/fsdp2-full/fp32/pf0-u1/n1/b8", "'pf0-u1' is not canonical; write 'pf0'"),
        ("vit-base/fsdp2-full/fp32/pf0-u02/n1/b8", "'pf0-u02' is not canonical; write 'pf0-u2'"),
        ("vit-base/fsdp2-full/fp32/pre-lag-u2/n1/b8", "FSDP1 knobs 'pre-lag-u2' given for FSDP2 strategy"),
    ],
)
def test_bad_unit_sizes_are_one_line_naming_them(path: str, culprit: str) -> None:
    with pytest.raises(SpecError, match=culprit) as e:
        RunSpec.from_path(path)
    assert "\n" not in str(e.value)


def test_a_unit_larger_than_a_stack_is_refused_where_the_stacks_are_known() -> None:
    from scaleladder.spec import check_unit_layers

    check_unit_layers("vit-base", parse_knobs("pf0-u12"), [12])
    check_unit_layers("flava-350m", parse_knobs("pf0-u6"), [12, 12, 6])
    with pytest.raises(SpecError, match=r"'pf0-u3': a unit of 3 blocks is larger than a stack of flava-debug "
                                        r"\(stacks of 2, 2, 1 blocks\); -u1 at most") as e:
        check_unit_layers("flava-debug", parse_knobs("pf0-u3"), [2, 2, 1])
    assert "\n" not in str(e.value)
