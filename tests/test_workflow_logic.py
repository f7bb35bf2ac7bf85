"""scaleladder.site's config, ladder and commands, the logic behind workflow/rules/*.smk, called directly: config
validation and its defaults, --config string coercion, the ladder's expansion and skips,
the planner's routing, the site's strings. No Snakemake run, except the last tests, which
pin how many jobs of each rule every profile's dry run plans (so a change to the rules or
to this module cannot alter a site's DAG silently)."""

from __future__ import annotations

import copy
import dataclasses
import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from conftest import REPO, snakemake, workflow_copy
from scaleladder.site import commands as swf
from scaleladder.site import config as site_config
from scaleladder.site import ladder as site_ladder
from scaleladder.site.settings import Site, SiteConfig
from scaleladder.spec import DEFAULT_KNOBS, RunSpec, parse_knobs, parse_strategy

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"

# A site of our own, so that no profile edit changes these tests: 4 ranks per node.
SITE: dict[str, Any] = {
    "name": "testsite",
    "ranks_per_node": 4,
    "scaleladder": "sl",
    "launcher": "L -N{nodes} -n{ranks} {image} x",
    "supervise": "launch",
}


def no_gpu() -> int:
    return 0


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers over earlier ones, dicts merged key by key: as Snakemake merges the
    Snakefile's configfile, the profile's site.yaml and --config."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in copy.deepcopy(layer).items():
            out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def cfg(*ladders: dict[str, Any], **over: Any) -> dict[str, Any]:
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    blocks = list(ladders) or [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]}]
    return merged(base, {"site": SITE, "ladders": blocks}, over)


def prepare(config: dict[str, Any], gpu_count: Any = no_gpu) -> tuple[site_ladder.Ladder, str]:
    log = io.StringIO()
    return site_ladder.prepare(config, SCHEMA, log=log, gpu_count=gpu_count), log.getvalue()


def typed(**over: Any) -> SiteConfig:
    """The test site's config with ``over``, validated (the schema's defaults filled) and typed."""
    return prepare(cfg(**over))[0].settings


def site(**over: Any) -> Site:
    """The test site with ``over``, typed (the schema's defaults where not given)."""
    return Site.of({**SITE, **over}, "site")


def paths(ladder: site_ladder.Ladder) -> list[str]:
    return [s.path for s in ladder.rungs]


def spec(path: str) -> RunSpec:
    return RunSpec.from_path(path)


# -- the ladder -----------------------------------------------------------------------------


def test_a_block_is_its_full_cross_product_in_config_order() -> None:
    block = {"models": ["vit-debug", "flava-debug"], "strategies": ["ddp", "fsdp-full"],
             "precisions": ["fp32", "bf16-mixed"], "batches": [4, 8], "nodes": [1, 2]}
    ladder, notes = prepare(cfg(block))
    assert len(ladder.rungs) == 2 * 2 * 2 * 2 * 2 and not ladder.skipped and notes == ""
    assert paths(ladder)[:3] == ["vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/ddp/fp32/pre-lag/n1/b8",
                                 "vit-debug/ddp/fp32/pre-lag/n2/b4"]
    assert set(paths(ladder)) == {f"{m}/{s}/{p}/pre-lag/n{n}/b{b}" for m in ("vit-debug", "flava-debug")
                                  for s in ("ddp", "fsdp-full") for p in ("fp32", "bf16-mixed")
                                  for n in (1, 2) for b in (4, 8)}
    assert ladder.selected == ladder.rungs


def test_blocks_are_joined_without_duplicates() -> None:
    first = {"models": ["vit-debug"], "strategies": ["ddp", "fsdp-full"], "batches": [4]}
    second = {"models": ["flava-debug", "vit-debug"], "strategies": ["fsdp-full"], "batches": [4]}
    ladder, _ = prepare(cfg(first, second))
    # the rung both blocks declare comes once, where the first block put it
    assert paths(ladder) == ["vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4",
                             "flava-debug/fsdp-full/fp32/pre-lag/n1/b4"]


def test_knobs_multiply_fsdp_rungs_only() -> None:
    block = {"models": ["vit-debug"], "strategies": ["ddp", "fsdp-full"], "knobs": ["pre-lag", "post-nolag"], "batches": [4]}
    ladder, notes = prepare(cfg(block))
    # DDP has no FSDP knobs: both settings collapse onto its one default-knob rung, silently
    assert paths(ladder) == ["vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4",
                             "vit-debug/fsdp-full/fp32/post-nolag/n1/b4"]
    assert not ladder.skipped and notes == ""


def test_max_batches_are_rungs_of_their_own() -> None:
    ladder, _ = prepare(cfg({"models": ["vit-debug"], "strategies": ["fsdp-full-ac"], "batches": ["max", 4]}))
    top = ladder.rungs[0]
    assert top.batch == "max" and top.path == "vit-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax"
    assert site_ladder.rung_path(top) == "results/rungs/vit-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax.h5"
    assert ladder.rungs[1].batch == 4


def test_combinations_that_do_not_exist_are_skipped_with_the_reason() -> None:
    block = {"models": ["vit-debug"], "strategies": ["single", "fsdp-hybrid8", "fsdp-hybrid2"], "batches": [4], "nodes": [1, 2]}
    ladder, notes = prepare(cfg(block))  # 4 ranks per node
    assert paths(ladder) == ["vit-debug/single/fp32/pre-lag/n1/b4", "vit-debug/fsdp-hybrid8/fp32/pre-lag/n2/b4",
                             "vit-debug/fsdp-hybrid2/fp32/pre-lag/n1/b4", "vit-debug/fsdp-hybrid2/fp32/pre-lag/n2/b4"]
    assert list(ladder.skipped) == [
        "vit-debug/single/fp32/pre-lag/n2/b4: strategy 'single' runs in one process on one node",
        "vit-debug/fsdp-hybrid8/fp32/pre-lag/n1/b4: hybrid group 8 does not divide the world size 4",
    ]
    assert notes.startswith("scaleladder: 2 combination(s) of the ladder do not exist and are skipped:\n  vit-debug/single/")
    # and the aggregate records them
    assert '"skipped": ["vit-debug/single/fp32/pre-lag/n2/b4: ' in swf.provenance_json(ladder)


def test_expand_ladder_uses_the_world_the_site_launches() -> None:
    block = {"models": ["vit-debug"], "strategies": ["fsdp-hybrid8"], "precisions": ["fp32"], "knobs": ["pre-lag"],
             "nodes": [1], "batches": [4]}
    assert [s.path for s in site_ladder.expand_ladder([block], 8)[0]] == ["vit-debug/fsdp-hybrid8/fp32/pre-lag/n1/b4"]
    assert site_ladder.expand_ladder([block], 4)[0] == []


def test_ranks_per_node_auto_is_every_gpu_else_cpu_ranks() -> None:
    auto = site(ranks_per_node="auto", cpu_ranks=3)
    assert site_ladder.resolve_ranks_per_node(auto, lambda: 0) == 3
    assert site_ladder.resolve_ranks_per_node(auto, lambda: 8) == 8
    assert site_ladder.resolve_ranks_per_node(site(ranks_per_node="auto"), lambda: 0) == 2

    def never() -> int:
        raise AssertionError("a fixed ranks_per_node must not ask for GPUs (that imports torch)")

    assert site_ladder.resolve_ranks_per_node(site(ranks_per_node=8), never) == 8
    assert site_ladder.ranks_of(spec("vit-debug/single/fp32/pre-lag/n1/b4"), 8) == 1  # the one-process reference
    assert site_ladder.rank_args(spec("vit-debug/ddp/fp32/pre-lag/n2/b4"), 8) == (16, 8)


def test_select_keeps_some_rungs_and_the_targets_follow() -> None:
    block = {"models": ["vit-debug", "flava-debug"], "strategies": ["ddp", "fsdp-full"], "batches": [4, "max"]}
    ladder, _ = prepare(cfg(block, select={"models": ["flava-debug"], "batches": "max"}))
    assert [s.path for s in ladder.selected] == ["flava-debug/ddp/fp32/pre-lag/n1/bmax", "flava-debug/fsdp-full/fp32/pre-lag/n1/bmax"]
    # a select run ends with the ladder, figures and report of what it selected
    assert site_ladder.final_targets(ladder) == site_ladder.final_targets(prepare(cfg(block))[0])
    assert ladder.rung_files == ["results/rungs/flava-debug/ddp/fp32/pre-lag/n1/bmax.h5",
                                 "results/rungs/flava-debug/fsdp-full/fp32/pre-lag/n1/bmax.h5"]
    assert "select kept 2 of 8 rungs" in site_ladder.select_note(ladder)
    assert '"select"' in swf.provenance_json(ladder) and '"select"' not in swf.provenance_json(prepare(cfg(block))[0])
    assert site_ladder.is_selected(spec("vit-debug/ddp/fp32/pre-lag/n2/b4"), {"nodes": "1, 2", "strategies": ["ddp"]})
    assert not site_ladder.is_selected(spec("vit-debug/ddp/fp32/pre-lag/n2/b4"), {"nodes": 1})


def test_without_select_the_targets_are_the_ladder_its_table_figures_and_report() -> None:
    ladder, _ = prepare(cfg())
    targets = site_ladder.final_targets(ladder)
    assert targets[:3] == ["results/ladder.h5", "results/rungs.csv", "results/report.html"]
    assert "results/plots/pareto.png" in targets and "results/plots/pareto.pdf" in targets
    assert len(targets) == 3 + 2 * len(site_ladder.FIGURES) and "results/plots/fits.png" not in targets


def test_wildcards_take_only_what_the_ladder_declares() -> None:
    ladder, _ = prepare(cfg({"models": ["vit-debug"], "strategies": ["fsdp-full-ac", "ddp"], "batches": [4]}))
    c = site_ladder.wildcard_constraints(ladder.rungs)
    assert re.fullmatch(c["model"], "vit-debug") and not re.fullmatch(c["model"], "vit-tiny")
    assert re.fullmatch(c["strategy"], "fsdp-full-ac") and re.fullmatch(c["strategy"], "ddp")
    assert not re.fullmatch(c["strategy"], "fsdp-full")  # not declared, although a valid name
    assert re.fullmatch(c["knobs"], "pre-lag") and not re.fullmatch(c["knobs"], "post-nolag")
    assert c["nodes"] == c["px"] == r"\d+" and "batch" not in c  # the rules constrain batch themselves


def test_spec_of_reads_a_rules_wildcards() -> None:
    w = SimpleNamespace(model="vit-debug", strategy="fsdp-hybrid2", precision="bf16-mixed", knobs="post-nolag", nodes="2", batch="max")
    assert swf.spec_of(w).path == "vit-debug/fsdp-hybrid2/bf16-mixed/post-nolag/n2/bmax"


def test_rung_data_is_the_shard_set_for_the_models_image_size() -> None:
    assert site_ladder.rung_inputs(spec("vit-debug/ddp/fp32/pre-lag/n1/b4"), "embedded") == ["results/shards/32px/manifest.json"]
    assert site_ladder.rung_inputs(spec("vit-base/ddp/fp32/pre-lag/n1/b4"), "embedded") == ["results/shards/224px/manifest.json"]
    assert site_ladder.rung_inputs(spec("vit-base/ddp/fp32/pre-lag/n1/b4"), "synthetic") == []
    assert site_ladder.rung_data_path(spec("vit-base/ddp/fp32/pre-lag/n1/b4"), "synthetic") == "synthetic"
    assert site_ladder.data_source(typed()) == "embedded" and site_ladder.data_source(typed(data={"source": "synthetic"})) == "synthetic"


# -- the planner's routing ------------------------------------------------------------------

PLANNED = {"models": ["vit-debug", "flava-10b"], "strategies": ["ddp"], "batches": [4]}


def test_a_site_with_a_plan_device_records_rungs_that_cannot_fit() -> None:
    ladder, notes = prepare(cfg(PLANNED, site={"plan_device": "a100-40gb"}, data={"source": "synthetic"}))
    assert ladder.predicted_oom == {"flava-10b/ddp/fp32/pre-lag/n1/b4"}
    assert ladder.rung_files == ["results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5",
                                 "results/predicted/flava-10b/ddp/fp32/pre-lag/n1/b4.h5"]
    assert "scaleladder: 1 rung(s) are predicted not to fit on a100-40gb" in notes
    # the planner's own figures join the targets, and its rule and the search get the device
    assert "results/plots/fits.png" in site_ladder.final_targets(ladder) and site_ladder.plan_figures(ladder.settings.site) == ["fits", "predicted_vs_measured"]
    big = spec("flava-10b/ddp/fp32/pre-lag/n1/b4")
    assert swf.plan_args(ladder.settings, ladder.ranks_per_node, big) == " --plan-device a100-40gb --ranks-per-node 4"
    assert swf.plan_chart_args(ladder) == "--device a100-40gb --nodes 1 --gpus-per-node 4 --precision fp32"


def test_repeats_run_each_measured_rung_again_and_keep_the_one_path_without() -> None:
    """`repeats: R` is R jobs per measured rung (<spec>.r<k>.h5 beside <spec>.h5);
    a predicted-oom verdict is not a measurement and is recorded once."""
    one, _ = prepare(cfg(PLANNED, site={"plan_device": "a100-40gb"}, data={"source": "synthetic"}))
    three, _ = prepare(cfg(PLANNED, site={"plan_device": "a100-40gb"}, data={"source": "synthetic"}, repeats="3"))
    assert one.rung_files == three.rung_files[:1] + three.rung_files[3:]  # R = 1: the paths as ever
    assert three.rung_files == ["results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5",
                                "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.r1.h5",
                                "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.r2.h5",
                                "results/predicted/flava-10b/ddp/fp32/pre-lag/n1/b4.h5"]
    selected, _ = prepare(cfg(PLANNED, data={"source": "synthetic"}, repeats=2, select={"models": ["vit-debug"]}))
    assert selected.rung_files == ["results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5",
                                   "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.r1.h5"]
    assert re.fullmatch(site_ladder.wildcard_constraints(three.rungs)["rep"], ".r2")
    assert re.fullmatch(site_ladder.wildcard_constraints(three.rungs)["rep"], "")
    assert not re.fullmatch(site_ladder.wildcard_constraints(three.rungs)["rep"], ".r0")  # repeat 0 has no suffix
    with pytest.raises(site_config.ConfigError, match="config key 'repeats'"):
        prepare(cfg(repeats=0))


def test_without_a_plan_device_every_rung_runs() -> None:
    ladder, notes = prepare(cfg(PLANNED, data={"source": "synthetic"}))
    assert ladder.predicted_oom == frozenset() and "predicted" not in notes
    assert all(f.startswith("results/rungs/") for f in ladder.rung_files)
    assert site_ladder.plan_figures(ladder.settings.site) == [] and "results/plots/fits.png" not in site_ladder.final_targets(ladder)
    assert swf.plan_args(ladder.settings, 4, spec("flava-10b/ddp/fp32/pre-lag/n1/b4")) == ""


def test_run_predicted_oom_runs_them_and_tells_the_search() -> None:
    # a --config string, as Snakemake passes it
    ladder, _ = prepare(cfg(PLANNED, site={"plan_device": "a100-40gb"}, run_predicted_oom="true"))
    assert ladder.predicted_oom == frozenset()
    assert swf.plan_args(ladder.settings, 4, spec("flava-10b/ddp/fp32/pre-lag/n1/b4")).endswith(" --run-predicted-oom")


def test_plan_chart_shows_the_smallest_node_count_and_most_common_precision() -> None:
    blocks = ({"models": ["vit-debug"], "strategies": ["ddp"], "precisions": ["bf16-mixed", "fp32"], "batches": [4, 8], "nodes": [2]},
              {"models": ["vit-debug"], "strategies": ["fsdp-full"], "precisions": ["bf16-mixed"], "batches": [4], "nodes": [2, 4]})
    ladder, _ = prepare(cfg(*blocks, site={"plan_device": "h100-80gb"}))
    assert swf.plan_chart_args(ladder) == "--device h100-80gb --nodes 2 --gpus-per-node 4 --precision bf16-mixed"


# -- the site's strings ---------------------------------------------------------------------


def test_env_exports_quote_every_value_and_keep_shell_variables() -> None:
    with_env = site(env={"A": "x y", "B": "$HOME/cache", "N": 5, "F": "FALSE"})
    assert swf.env_exports(with_env) == 'export A="x y"; export B="$HOME/cache"; export N="5"; export F="FALSE"; '
    assert swf.env_exports(site(env={})) == swf.env_exports(site()) == ""


def test_launcher_fills_nodes_ranks_and_image_but_no_shell_braces() -> None:
    srun = site(launcher="srun -N{nodes} -n{ranks} --per {ranks_per_node} {image} run", image="${IMG:-$PWD/a.sif}")
    assert swf.launcher(srun, 8, spec("vit-base/fsdp-full/bf16-mixed/pre-lag/n2/b32")) == \
        "srun -N2 -n16 --per 8 ${IMG:-$PWD/a.sif} run"
    assert swf.launcher(srun, 8, spec("vit-base/single/bf16-mixed/pre-lag/n1/b32")).startswith("srun -N1 -n1 ")
    # without a rung (how a job calls scaleladder), {nodes} and {ranks} stay as they are
    assert swf.fill("{image} sl {nodes}", srun, 8) == "${IMG:-$PWD/a.sif} sl {nodes}"
    assert swf.fill("{image} sl", site(), 8) == " sl"


def test_prologue_runs_before_the_launcher_or_not_at_all() -> None:
    s = spec("vit-base/ddp/fp32/pre-lag/n4/b8")
    assert swf.prologue(site(prologue="srun -N{nodes} mkdir -p /tmp/x  "), 8, s) == "srun -N4 mkdir -p /tmp/x; "
    assert swf.prologue(site(prologue=""), 8, s) == swf.prologue(site(), 8, s) == ""


def test_ranks_and_device_arguments() -> None:
    assert swf.ranks_arg(spec("vit-base/ddp/fp32/pre-lag/n2/b8"), 8) == " --ranks-per-node 8"
    assert swf.ranks_arg(spec("vit-base/single/fp32/pre-lag/n1/b8"), 8) == " --ranks-per-node 1"
    assert swf.device_arg(site(device="cuda")) == " --device cuda"
    assert swf.device_arg(site(device="cpu")) == " --device cpu"
    assert swf.device_arg(site(device="auto")) == swf.device_arg(site()) == ""


def test_the_device_argument_comes_from_the_sites_device() -> None:
    ladder, _ = prepare(cfg(site={"device": "cuda"}))
    assert swf.device_arg(ladder.settings.site) == " --device cuda"
    ladder, _ = prepare(cfg())
    assert ladder.settings.site.device == "auto" and swf.device_arg(ladder.settings.site) == ""  # the schema's default


def test_maxbatch_arguments_only_those_given() -> None:
    assert swf.maxbatch_args(typed()) == ""
    assert swf.maxbatch_args(typed(site={"max_batch_cap": 4}, maxbatch={"probe_warmup": 1, "max_retries": 2})) == \
        " --max-batch-cap 4 --max-retries 2 --probe-warmup 1"


def test_shard_sources() -> None:
    assert swf.shard_sources(typed()) == ""
    files = {"images": "im", "captions": "c.csv", "wds": ["a.tar", "b.tar"], "vocab": "v.txt"}
    assert swf.shard_sources(dataclasses.replace(typed(), data=SiteConfig.of({**cfg(), "data": files}, "").data)) == \
        "--images im --captions c.csv --wds a.tar b.tar --vocab v.txt"


def test_provenance_records_the_ladder_as_declared_with_defaults() -> None:
    import json

    ladder, _ = prepare(cfg(steps=4, warmup=1))
    prov = json.loads(swf.provenance_json(ladder))
    assert prov == {"site": "testsite", "ranks_per_node": 4, "steps": 4, "warmup": 1, "repeats": 1, "seed": 0, "skipped": [],
                    "data": ladder.config["data"],
                    "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4], "precisions": ["fp32"],
                                 "knobs": ["pre-lag"], "nodes": [1]}]}
    assert swf.provenance_json(ladder).startswith('{"data": ')  # sorted keys: one config, one string


# -- --config strings -----------------------------------------------------------------------


def test_config_strings_become_numbers_and_booleans_where_the_schema_wants_them() -> None:
    c: dict[str, Any] = {
        "run_predicted_oom": "True",
        "site": {"ranks_per_node": "8", "cpu_ranks": "2", "max_nodes": "4", "supervisor_can_launch": "false", "name": "7"},
        "maxbatch": {"max_retries": "1", "probe_steps": "-1"},
        "ladders": [{"models": ["123"], "batches": ["8", "max"], "nodes": ["1", "2"]}, "not a block"],
        "data": {"samples": "32", "per_shard": "16", "seed": "0", "source": "synthetic"},
    }
    site_config.coerce_config_strings(c)
    assert c["run_predicted_oom"] is True and c["site"]["supervisor_can_launch"] is False
    assert c["site"] == {"ranks_per_node": 8, "cpu_ranks": 2, "max_nodes": 4, "supervisor_can_launch": False, "name": "7"}
    assert c["maxbatch"] == {"max_retries": 1, "probe_steps": "-1"}  # only digits: the schema names '-1'
    assert c["ladders"][0] == {"models": ["123"], "batches": [8, "max"], "nodes": [1, 2]}  # a name stays a name
    assert c["data"] == {"samples": 32, "per_shard": 16, "seed": 0, "source": "synthetic"}
    c = {"run_predicted_oom": "FALSE", "site": {"ranks_per_node": "auto"}}
    site_config.coerce_config_strings(c)
    assert c == {"run_predicted_oom": False, "site": {"ranks_per_node": "auto"}}
    assert site_config.as_bool("maybe") == "maybe" and site_config.as_bool(1) == 1 and site_config.as_int("07") == 7 and site_config.as_int(" 7") == " 7"


def test_the_coercion_is_read_from_the_schema() -> None:
    """A key the schema declares (through $ref and anyOf too) is coerced without a line of code;
    one that allows a string besides stays a string."""
    schema = {"type": "object", "definitions": {"n": {"type": "number"}},
              "properties": {"new": {"type": "integer"}, "ref": {"$ref": "#/definitions/n"},
                             "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                             "flags": {"type": "array", "items": {"type": "boolean"}}}}
    c: dict[str, Any] = {"new": "3", "ref": "0.5", "either": "7", "flags": ["true", "False"], "unknown": "1"}
    site_config.coerce_config_strings(c, schema)
    assert c == {"new": 3, "ref": 0.5, "either": "7", "flags": [True, False], "unknown": "1"}


def test_the_rules_read_a_frozen_typed_config_built_once() -> None:
    ladder, _ = prepare(cfg(maxbatch={"probe_steps": 3}, data={"source": "synthetic"}))
    s = ladder.settings
    assert (s.steps, s.warmup, s.seed, s.repeats) == tuple(ladder.config[k] for k in ("steps", "warmup", "seed", "repeats"))
    assert s.site.name == "testsite" and s.site.device == "auto" and s.site.launcher == SITE["launcher"]
    assert s.data.source == "synthetic" and s.maxbatch.probe_steps == 3 and s.maxbatch.max_retries is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.steps = 1  # type: ignore[misc]
    assert swf.maxbatch_args(s) == " --probe-steps 3"


def test_a_config_given_entirely_as_strings_validates() -> None:
    strings = cfg({"models": ["vit-debug"], "strategies": ["ddp"], "batches": ["4", "max"], "nodes": ["1"]},
                  steps="5", warmup="1", run_predicted_oom="false",
                  site={"ranks_per_node": "2", "supervisor_can_launch": "true"}, maxbatch={"probe_steps": "3"})
    # every key the schema declares an integer is coerced, steps and warmup too (the
    # coercion is read from the schema; before it, a hand-written list left these two out)
    ladder, _ = prepare(strings)
    assert ladder.config["steps"] == 5 and ladder.config["warmup"] == 1
    assert paths(ladder) == ["vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/ddp/fp32/pre-lag/n1/bmax"]
    assert ladder.ranks_per_node == 2 and ladder.config["maxbatch"] == {"probe_steps": 3}


# -- config errors name the key -------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"ladders": [{"models": ["vit-tiny"], "strategies": ["ddp"], "batches": [4]}]},
         "config key 'ladders[0].models[0]': unknown model 'vit-tiny'"),
        ({"ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]},
                      {"models": ["vit-debug"], "strategies": ["zero3"], "batches": [4]}]},
         "config key 'ladders[1].strategies[0]': unknown strategy 'zero3'"),
        ({"ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "precisions": ["fp32", "fp8"], "batches": [4]}]},
         "config key 'ladders[0].precisions[1]': unknown precision 'fp8'"),
        ({"ladders": [{"models": ["vit-debug"], "strategies": ["fsdp-full"], "knobs": ["sideways"], "batches": [4]}]},
         "config key 'ladders[0].knobs[0]': unknown FSDP knobs 'sideways'"),
        ({"ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [0]}]},
         "config key 'ladders[0].batches[0]': 0 is none of the allowed forms: an integer >= 1, or 'max'"),
        ({"steps": 2, "warmup": 2}, "config key 'warmup': warmup must be in [0, steps), got warmup=2 with steps=2"),
        ({"steps": "abc"}, "config key 'steps': 'abc' is not of type 'integer'"),
        ({"site": {"plan_device": "rtx4090"}}, "config key 'site.plan_device': unknown device 'rtx4090'; expected one of "),
        ({"site": {"supervise": "sometimes"}}, "config key 'site.supervise': 'sometimes' is not one of ['launch', 'finalize']"),
        ({"site": {"supervisor_can_launch": "false"}, "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4, "max"]}]},
         "config key 'ladders[0].batches': 'max' needs a max-batch search, which starts the launcher itself, "
         "but site 'testsite' has supervisor_can_launch: false"),
        ({"site": {"max_nodes": "2"}, "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4], "nodes": [1, 4]}]},
         "config key 'ladders[0].nodes': 4 nodes, but site 'testsite' launches on at most 2 (site.max_nodes)"),
        ({"maxbatch": {"max_retries": "-1"}}, "config key 'maxbatch.max_retries': '-1' is not of type 'integer'"),
        ({"maxbatch": {"probe_steps": 0}}, "config key 'maxbatch.probe_steps': 0 is less than the minimum of 1"),
        ({"bogus": 1}, "config key '(top level)': unknown key 'bogus' (the keys here: "),
        ({"select": {"model": ["vit-debug"]}}, "config key 'select': unknown key 'model'; did you mean 'models'? (the keys here: "
                                               "batches, knobs, models, nodes, precisions, strategies)"),
        ({"run_predicted_oom": "maybe"}, "config key 'run_predicted_oom': 'maybe' is not of type 'boolean'"),
    ],
)
def test_a_bad_config_fails_naming_the_key(over: dict[str, Any], message: str) -> None:
    with pytest.raises(site_config.ConfigError) as e:
        prepare(cfg(**over))
    assert str(e.value).startswith("invalid scaleladder config:\n  config key '")
    assert message in str(e.value)


def test_every_schema_error_is_named_at_once_sorted_by_key() -> None:
    with pytest.raises(site_config.ConfigError) as e:
        prepare(cfg(steps="abc", workers=-1, site={"name": 3}))
    assert str(e.value).splitlines() == [
        "invalid scaleladder config:",
        "  config key 'site.name': 3 is not of type 'string'",
        "  config key 'steps': 'abc' is not of type 'integer'",
        "  config key 'workers': -1 is less than the minimum of 0",
    ]


def test_without_a_site_the_error_points_to_the_profiles() -> None:
    c = cfg()
    del c["site"]
    with pytest.raises(site_config.ConfigError) as e:
        prepare(c)
    assert str(e.value).splitlines()[1:] == [
        "  config key '(top level)': 'site' is a required property",
        "  (the site and its ladder come from a profile: snakemake --profile profiles/<site>)",
    ]


def test_a_select_matching_no_rung_fails_naming_the_value_and_the_nearest_name() -> None:
    with pytest.raises(site_config.ConfigError, match=r"^scaleladder: config key 'select.models\[0\]': 'vit-huge' matches no rung of the "
                       r"ladder(; did you mean '[a-z-]+'\?)? \(the ladder's models: "):
        prepare(cfg(select={"models": ["vit-huge"]}))
    with pytest.raises(site_config.ConfigError) as e:  # a typo among good values is not silently dropped
        prepare(cfg({"models": ["vit-debug", "flava-debug"], "strategies": ["ddp", "fsdp-full"], "batches": [4]},
                    select={"models": ["flava-debug", "vit-debg"]}))
    assert "'select.models[1]': 'vit-debg' matches no rung of the ladder; did you mean 'vit-debug'?" in str(e.value)
    with pytest.raises(site_config.ConfigError, match=r"'select.strategies\[0\]': 'fsdp-ful' .*did you mean 'fsdp-full'\?"):
        prepare(cfg({"models": ["vit-debug"], "strategies": ["ddp", "fsdp-full"], "batches": [4]}, select={"strategies": "fsdp-ful"}))
    with pytest.raises(site_config.ConfigError, match=r"no rung has all of models: flava-debug; strategies: fsdp-full$"):
        prepare(cfg({"models": ["vit-debug"], "strategies": ["fsdp-full"], "batches": [4]},
                    {"models": ["flava-debug"], "strategies": ["ddp"], "batches": [4]},
                    select={"models": ["flava-debug"], "strategies": ["fsdp-full"]}))


def test_bf16_is_bf16_mixed_in_the_ladder_and_in_select(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SCALELADDER_PRECISION_ALIAS_SAID", raising=False)
    ladder, _ = prepare(cfg({"models": ["vit-debug"], "strategies": ["ddp"], "precisions": ["bf16", "fp32"], "batches": [4]},
                            select={"precisions": "bf16"}))
    assert [s.path for s in ladder.selected] == ["vit-debug/ddp/bf16-mixed/pre-lag/n1/b4"]
    assert ladder.rung_files == ["results/rungs/vit-debug/ddp/bf16-mixed/pre-lag/n1/b4.h5"]
    assert capsys.readouterr().err.count("precision 'bf16' is read as 'bf16-mixed'") == 1


# -- one validation, with the schema's defaults ----------------------------------------------


def test_validation_fills_the_schemas_defaults_once_everywhere() -> None:
    c = {"site": dict(SITE), "steps": 3, "warmup": 1,
         "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]},
                     {"models": ["vit-debug"], "strategies": ["fsdp-full"], "batches": [4], "precisions": ["bf16-mixed"]}]}
    schema = site_config.load_schema(SCHEMA)
    pristine = copy.deepcopy(schema)
    site_config.validate_config(c, schema)
    first, second = c["ladders"]
    assert first == {"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4], "precisions": ["fp32"],
                     "knobs": [DEFAULT_KNOBS], "nodes": [1]}
    assert second["precisions"] == ["bf16-mixed"]  # given values are kept
    assert c["site"] == dict(SITE, cpu_ranks=2, device="auto", plan_device="", image="", supervisor_can_launch=True,
                             env={}, prologue="", local_data=False, pack=False)
    # a default object is filled in turn (data: {} -> its own defaults)
    assert c["data"] == {"source": "embedded", "samples": 256, "per_shard": 64, "seed": 0}
    assert (c["seed"], c["workers"], c["run_predicted_oom"], c["maxbatch"], c["select"]) == (0, 0, False, {}, {})
    # TRAP: each default is a copy, not the schema's own object
    assert schema == pristine
    c2 = {"site": dict(SITE), "steps": 3, "warmup": 1, "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]}]}
    site_config.validate_config(c2, schema)
    assert c2["ladders"][0]["precisions"] is not first["precisions"]
    first["precisions"].append("tf32")
    assert c2["ladders"][0]["precisions"] == ["fp32"] and schema == pristine


def test_the_schema_defaults_are_the_run_spec_defaults() -> None:
    block = site_config.load_schema(SCHEMA)["properties"]["ladders"]["items"]["properties"]
    assert block["knobs"]["default"] == [DEFAULT_KNOBS] and str(parse_knobs(DEFAULT_KNOBS)) == DEFAULT_KNOBS
    assert block["precisions"]["default"] == [RunSpec(model="vit-debug", strategy=parse_strategy("ddp")).precision]
    assert block["nodes"]["default"] == [1]


def test_every_ladder_rule_builds_its_command_in_one_place() -> None:
    """The rung's command line is written once (swf.rung_shell, its arguments swf.RUNG_ARGS), not
    once per ladder rule; the dry runs of every profile print the same commands as before."""
    text = (REPO / "workflow" / "rules" / "ladder.smk").read_text()
    # and one more: the pack's, which runs its rungs through these rules (scaleladder pack)
    assert len(re.findall(r"^ +shell:$", text, re.M)) - 1 == text.count("swf.rung_shell(") == 4
    assert "--spec" not in text and "--steps" not in text
    for command in ("launch", "maxbatch", "plan-only"):
        assert swf.rung_shell(command).count(swf.RUNG_ARGS) == 1
    assert swf.rung_shell("finalize").count(swf.RUNG_ARGS) == 2  # `<launcher> run`, then `finalize`
    with pytest.raises(ValueError, match="unknown command 'run'"):
        swf.rung_shell("run")


def test_the_rules_hold_no_logic_of_their_own() -> None:
    """common.smk is the rules' glue only: every function in it is a line or two that calls
    scaleladder.site, and no .smk file parses, validates or expands anything itself."""
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    functions = re.findall(r"^def (\w+)\(.*\):\n((?:    .*\n)+)", common, re.M)
    assert len(functions) >= 7
    for name, body in functions:
        lines = [line for line in body.splitlines() if line.strip()]
        # data_arg only reads its own rule's input (the shard manifest or nothing)
        assert len(lines) <= 2 and ("swf." in body or "site_schedule." in body or name == "data_arg"), f"{name}:\n{body}"
    for f in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        text = f.read_text()
        for word in ("jsonschema", "itertools", "parse_strategy", "set_default", "setdefault(", "DEFAULT_KNOBS", "import torch"):
            assert word not in text, f"{f.name} does {word}: that belongs in scaleladder.site"


# -- every profile's DAG, pinned -------------------------------------------------------------

# Jobs per rule of `snakemake --profile profiles/P -n --config data={source: synthetic}`
# (with embedded data each also runs one shard job per image size: `SHARDS`). Recorded
# before the workflow's logic moved into scaleladder.workflow (now scaleladder.site) and unchanged by it; a
# change here is a change to a site's ladder and must be deliberate. `export`: results/rungs.csv.
PINNED: dict[str, dict[str, int]] = {
    # local: + vit-debug/fsdp2-full/fp32/pf0-u2 (FSDP2's two blocks as one unit: the unit-size block)
    "local": {"rung": 17, "rung_max": 4, "aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1, "total": 26},
    "slurm-localhost": {"rung": 2, "rung_max": 1, "aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1, "total": 8},
    # frontier: + 12 ViT-15B AC rungs (fsdp-full-ac, fsdp-hybrid4-ac, fsdp-hybrid8-ac x 1/2/4/8 nodes) that fill the
    # 15B panel of the ViT seed's Figures 2-3, which no plain rung fits (profiles/frontier/site.yaml)
    "frontier": {"rung": 250, "predicted_oom": 95, "aggregate": 1, "export": 1, "plots": 1, "plan_plots": 1, "report": 1, "all": 1,
                 "total": 351},
    # a100: + the 1/2/4-node ViT weak-scaling block (24 rungs); since the planner models
    # the SDPA FLAVA the rungs run, 3 FLAVA rungs fit 8 x A100-40GB that TorchMultimodal's
    # did not (14 -> 11 predicted OOM: one b8 rung, two max-batch searches)
    "a100": {"rung": 85, "rung_max": 52, "predicted_oom": 11, "aggregate": 1, "export": 1, "plots": 1, "plan_plots": 1, "report": 1,
             "all": 1, "total": 154},
}
SHARDS = {"local": 2, "slurm-localhost": 1, "frontier": 1, "a100": 1}  # 32+64 px (debug flavors); 224 px
# The profiles that pack (site.pack): PINNED is their dry run with `site={pack: false}`, a job per rung;
# by default the same rungs run in these packs (a rung the time model cannot price runs as a job of its own:
# a100's vit-3b/ddp-compile max-batch rung, whose eager rung does not fit batch 1).
PACKED: dict[str, dict[str, int]] = {
    "frontier": {"pack": 9, "predicted_oom": 95, "all": 1, "total": 105},
    "a100": {"pack": 28, "rung_max": 1, "predicted_oom": 11, "all": 1, "total": 41},
}


def profile_config(profile: str, **over: Any) -> dict[str, Any]:
    """The config Snakemake builds for ``--profile profiles/P``: config/config.yaml, the
    profile's site.yaml over it, then --config."""
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    site = yaml.safe_load((REPO / "profiles" / profile / "site.yaml").read_text())
    return merged(base, site, over)


def rule_counts(ladder: site_ladder.Ladder) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in ladder.rungs:
        rule = "predicted_oom" if s.path in ladder.predicted_oom else ("rung_max" if s.batch == "max" else "rung")
        counts[rule] = counts.get(rule, 0) + 1
    return counts


@pytest.mark.parametrize("profile", sorted(PINNED))
def test_each_profiles_ladder_as_the_module_sees_it(profile: str) -> None:
    ladder, _ = prepare(profile_config(profile, data={"source": "synthetic"}))  # no GPU: 'auto' is 2 CPU ranks
    pinned = {k: v for k, v in PINNED[profile].items() if k in ("rung", "rung_max", "predicted_oom")}
    assert rule_counts(ladder) == pinned
    sizes = {site_ladder.rung_data_path(s, "embedded") for s in ladder.rungs}
    assert len(sizes) == SHARDS[profile]


def job_counts(out: str) -> dict[str, int]:
    table = out[out.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="module")
def wf_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workflow_copy(tmp_path_factory.mktemp("logic") / "wf")


@pytest.mark.process
@pytest.mark.parametrize("profile", sorted(PINNED))
def test_each_profiles_dry_run_plans_the_pinned_jobs(wf_copy: Path, profile: str) -> None:
    unpacked = ["site={pack: false}"] if profile in PACKED else []
    out = snakemake(wf_copy, "--profile", f"profiles/{profile}", "-n", "--config", "data={source: synthetic}", *unpacked,
                    SCALELADDER_SLURM_ACCOUNT="x").stdout
    assert job_counts(out) == PINNED[profile]
    embedded = job_counts(snakemake(wf_copy, "--profile", f"profiles/{profile}", "-n", "--config", *unpacked or ["repeats=1"],
                                    SCALELADDER_SLURM_ACCOUNT="x").stdout)
    assert embedded == dict(PINNED[profile], shard=SHARDS[profile], total=PINNED[profile]["total"] + SHARDS[profile])
    if profile in PACKED:  # packed by default: every rung still planned, in a pack or as a job of its own
        run = snakemake(wf_copy, "--profile", f"profiles/{profile}", "-n", "--config", "data={source: synthetic}",
                        SCALELADDER_SLURM_ACCOUNT="x")
        assert job_counts(run.stdout) == PACKED[profile]
        in_packs = sum(int(n) for n in re.findall(r"^  n\d+-p\d+: (\d+) rung\(s\)", run.stderr, re.M))
        assert len(re.findall(r"^  n\d+-p\d+: ", run.stderr, re.M)) == PACKED[profile]["pack"]
        assert in_packs + PACKED[profile].get("rung", 0) + PACKED[profile].get("rung_max", 0) == \
            PINNED[profile].get("rung", 0) + PINNED[profile].get("rung_max", 0)


@pytest.mark.process
def test_repeats_multiply_the_rung_jobs_of_a_dry_run(wf_copy: Path) -> None:
    """`--config repeats=3` plans every measured rung three times, one ladder file."""
    (wf_copy / "repeats.yaml").write_text("ladders: [{models: [vit-debug], strategies: [ddp], batches: [4, max]}]\n")
    out = snakemake(wf_copy, "--profile", "profiles/local", "-n", "--configfile", "profiles/local/site.yaml",
                    "repeats.yaml", "--config", "data={source: synthetic}", "repeats=3").stdout
    assert job_counts(out) == {"rung": 3, "rung_max": 3, "aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1, "total": 11}
    assert "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/bmax.r2.h5" in out


def test_each_fsdp_generation_takes_its_own_knobs() -> None:
    """A block's knobs apply to the strategies of their generation; a strategy whose
    generation the block names no knob of (and every non-FSDP rung) gets its default."""
    block = {"models": ["vit-debug"], "strategies": ["ddp", "fsdp-full", "fsdp2-full"], "precisions": ["fp32"],
             "knobs": ["post-nolag", "pf1"], "nodes": [1], "batches": [4]}
    specs, skipped = site_ladder.expand_ladder([block], 2)
    assert sorted(s.path for s in specs) == [
        "vit-debug/ddp/fp32/pre-lag/n1/b4",
        "vit-debug/fsdp-full/fp32/post-nolag/n1/b4", "vit-debug/fsdp2-full/fp32/pf1/n1/b4",
    ] and not skipped
    only_fsdp1 = {**block, "knobs": ["post-nolag"]}  # FSDP2 rungs then get their default, pf0
    assert "vit-debug/fsdp2-full/fp32/pf0/n1/b4" in [s.path for s in site_ladder.expand_ladder([only_fsdp1], 2)[0]]


def test_a_profiles_profiling_and_loader_blocks_reach_every_rung_as_arguments() -> None:
    # a trace of steps after warm-up and an allocator snapshot, set once per profile: `run` arguments
    ladder, _ = prepare(cfg(profiling={"trace_steps": 3, "memory_snapshot": True}, loader={"decode": "gpu"}, site={"device": "cuda"}))
    assert swf.rung_options(ladder.settings) == " --device cuda --decode gpu --trace-steps 3 --memory-snapshot"
    assert not any(k.startswith("SCALELADDER_") for k, _ in ladder.settings.site.env)  # none through the environment
    plain, _ = prepare(cfg(loader={"decode": "cpu", "workers": 0}))  # the rung's own defaults: nothing added
    assert swf.rung_options(plain.settings) == ""
    assert swf.rung_options(typed(profiling={"progress_s": 5})) == " --progress-s 5"
    with pytest.raises(site_config.ConfigError, match="profiling"):
        prepare(cfg(profiling={"trace_step": 3}))
    with pytest.raises(site_config.ConfigError, match="config key 'profiling.trace_steps': 9, but a rung measures only 3"):
        prepare(cfg(steps=4, warmup=1, profiling={"trace_steps": 9}))


def test_loader_workers_override_the_configs_workers() -> None:
    assert swf.rung_workers(typed(workers=2)) == 2
    assert swf.rung_workers(typed(workers=2, loader={"workers": 7})) == 7
    assert swf.rung_workers(typed(workers=2, loader={"workers": 0})) == 0


def test_shards_are_settled_only_when_written_with_todays_data_settings(tmp_path: Path) -> None:
    """A reshard costs no finished rung: a rung takes its shards as ancient() input only when the
    finished set was written with the config's data settings (a reshard then writes the same
    bytes); data changed on purpose makes it a plain input, so the rungs run again."""
    import json

    manifest = tmp_path / "manifest.json"
    data = {"source": "embedded", "images": "/data/imgs/", "samples": 64, "per_shard": 16, "seed": 0}

    def settings(**over: Any) -> SiteConfig:  # only the data block matters here: the rest is the test site's
        return dataclasses.replace(typed(), data=SiteConfig.of({**globals()["cfg"](), "data": {**data, **over}}, "").data)

    cfg = settings()
    assert not site_ladder.shards_settled(str(manifest), cfg)  # none yet
    options = {"images": "/data/imgs", "captions": None, "wds": None, "vocab": None, "samples": 64, "per_shard": 16, "seed": 0,
               "out": "results/shards/32px", "image_size": 32}
    manifest.write_text(json.dumps({"scaleladder": {"options": options}}))
    assert site_ladder.shards_settled(str(manifest), cfg)
    for key, value in (("images", "/data/other"), ("samples", 128), ("seed", 1), ("wds", ["a.tar"]), ("captions", "/c.tsv")):
        assert not site_ladder.shards_settled(str(manifest), settings(**{key: value})), key
    manifest.write_text("{not json")
    assert not site_ladder.shards_settled(str(manifest), cfg)


@pytest.mark.process
def test_trackers_on_add_the_mlflow_rule_and_each_rungs_tensorboard_folder(wf_copy: Path) -> None:
    """trackers: the rung commands carry --tensorboard; one `mlflow` job after aggregate."""
    (wf_copy / "trackers.yaml").write_text(
        "ladders: [{models: [vit-debug], strategies: [ddp], batches: [4]}]\n"
        "trackers: {tensorboard: results/tensorboard, mlflow_uri: 'sqlite:///results/mlflow.db'}\n")
    out = snakemake(wf_copy, "--profile", "profiles/local", "-n", "-p", "--configfile", "profiles/local/site.yaml",
                    "trackers.yaml", "--config", "data={source: synthetic}").stdout
    assert job_counts(out)["mlflow"] == 1
    assert "--tensorboard results/tensorboard" in out
    assert "mlflow --ladder results/ladder.h5 --uri sqlite:///results/mlflow.db --experiment scaleladder" in out
