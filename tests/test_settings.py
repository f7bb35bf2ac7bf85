"""One route for a setting: the schema declares it; the typed config and its doc are generated from
the schema; a setting of every rung reaches the rank as a RunConfig argument; the rules' shell
templates stay byte for byte what they were (Snakemake reruns a finished rung whose template changed)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from scaleladder.rung.run_config import RunConfig, add_arguments, arg, config_from_args, flag_defaults, rule_args
from scaleladder.site import commands as swf
from scaleladder.site import config as site_config
from scaleladder.site import settings, settings_codegen
from scaleladder.site.settings import SiteConfig

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"

SITE = {"name": "t", "ranks_per_node": 2, "scaleladder": "scaleladder", "launcher": "", "supervise": "launch"}
LADDERS = [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]}]


def minimal(**over: Any) -> dict[str, Any]:
    return {"site": dict(SITE), "ladders": [dict(b) for b in LADDERS], "steps": 6, "warmup": 2, **over}


def test_settings_and_their_doc_are_what_the_schema_generates() -> None:
    schema = settings_codegen.load(SCHEMA)
    assert Path(settings.__file__).read_text() == settings_codegen.generate(schema), \
        "site/settings.py differs from the schema: python -m scaleladder.site.settings_codegen"
    assert (REPO / "docs" / "settings.md").read_text() == settings_codegen.generate_doc(schema), \
        "docs/settings.md differs from the schema: python -m scaleladder.site.settings_codegen"


def test_every_schema_key_is_a_typed_field_with_the_schemas_default() -> None:
    schema = settings_codegen.load(SCHEMA)
    typed = SiteConfig.of(validated(minimal()), "")

    def check(node: dict[str, Any], obj: Any, where: str) -> None:
        props = settings_codegen._Gen(schema).resolve(node).get("properties") or {}
        assert {f.name for f in dataclasses.fields(obj)} == set(props), where
        for key, sub in props.items():
            value = getattr(obj, key)
            sub_r = settings_codegen._Gen(schema).resolve(sub)
            if dataclasses.is_dataclass(value):
                check(sub, value, f"{where}.{key}")
            elif "default" in sub and key not in ("site", "ladders"):
                want = sub["default"]
                want = tuple(want) if isinstance(want, list) else tuple(want.items()) if isinstance(want, dict) else want
                assert value == want, f"{where}.{key}: {value!r} is not the schema's default {want!r}"
            elif "default" not in sub and sub_r.get("type") != "object" and where == ".data":
                assert value is None, f"{where}.{key}: not given, so None"

    check(schema, typed, "")
    hints = typing.get_type_hints(settings.Loader, vars(settings))
    assert hints["decode"] == typing.Literal["cpu", "gpu"]  # an enum is a Literal, not a str


def validated(cfg: dict[str, Any], schema: Any = SCHEMA) -> dict[str, Any]:
    site_config.validate_config(cfg, schema)
    return cfg


@pytest.mark.parametrize(("cfg", "key"), [
    ({**minimal(), "bogus": 1}, "'bogus'"),
    ({**minimal(), "site": {**SITE, "lancher": "x"}}, "'site.lancher'"),
    ({**minimal(), "ladders": [{**LADDERS[0], "model": ["x"]}]}, "'ladders[0].model'"),
    ({k: v for k, v in minimal().items() if k != "steps"}, "'steps': required"),
])
def test_an_unknown_or_missing_key_is_an_error_naming_it(cfg: dict[str, Any], key: str) -> None:
    with pytest.raises(site_config.ConfigError, match=re.escape(f"config key {key}")):
        SiteConfig.of(cfg, "")


def test_every_setting_of_every_rung_is_a_run_argument_with_the_rungs_own_default() -> None:
    rows = site_config.run_arg_rows()
    defaults = flag_defaults()
    assert {flag for _, flag, _ in rows} == {"--decode", "--transport", "--trace-steps", "--memory-snapshot", "--progress-s", "--models",
                                             "--tensorboard"}
    for path, flag, default in rows:
        assert flag in defaults, f"{'.'.join(path)}: run_arg {flag} is no RunConfig flag"
        assert defaults[flag] == default, f"{'.'.join(path)}: the schema's default {default!r} is not the rung's {defaults[flag]!r}"
    # none of them travels through the environment any more
    src = "\n".join(p.read_text() for p in (REPO / "src").rglob("*.py"))
    for name in ("TRACE_STEPS", "MEMORY_SNAPSHOT", "DECODE", "LOADER_TRANSPORT", "PROGRESS_S"):
        assert f"SCALELADDER_{name}" not in src


# The rules' templates as they ran before this module generated them: Snakemake's code trigger compares
# them (snakemake/persistence: rule.shellcmd), so any change reruns every finished rung of every user.
RUNG_ARGS = ("--spec {params.spec:q} --steps {params.steps} --warmup {params.warmup} --data {params.data:q} "
             "--workers {params.workers} --seed {params.seed} --out {output:q}")
LOG = " > {log:q} 2>&1"
TEMPLATES = {
    "launch": "{params.env}{params.scaleladder} launch --launcher {params.launcher:q}{params.ranks}{params.device} " + RUNG_ARGS + LOG,
    "finalize": ("rm -f {output:q}.oom-rank*.json; {params.env}{params.prologue}{params.launcher} run{params.device} " + RUNG_ARGS + LOG
                 + " && rc=0 || rc=$?; {params.scaleladder} finalize --rc $rc{params.device} " + RUNG_ARGS + " >> {log:q} 2>&1"),
    "maxbatch": ("{params.env}{params.prologue}{params.scaleladder} maxbatch --launcher {params.launcher:q}{params.plan}{params.cap}"
                 "{params.device} " + RUNG_ARGS + LOG),
    "plan-only": "{params.env}{params.scaleladder} launch --plan-only{params.plan} " + RUNG_ARGS + LOG,
}


def test_the_rules_templates_are_generated_byte_for_byte() -> None:
    assert rule_args() == swf.RUNG_ARGS == RUNG_ARGS
    for command, template in TEMPLATES.items():
        assert swf.rung_shell(command) == template, command


def test_a_new_setting_of_every_rung_takes_three_edits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake setting end to end. The three hand edits a contributor makes, and nothing else:

    1. the schema row, naming its ``run`` flag and saying what it is (its doc: docs/settings.md is
       generated from the row, as site/settings.py is);
    2. the RunConfig field with its flag (rung/run_config.py);
    3. where the rank reads it (``cfg.fake_every`` in the per-rank program; here, the parsed config).
    """
    # 1. the schema row
    schema = settings_codegen.load(SCHEMA)
    schema["properties"]["profiling"]["properties"]["fake_every"] = {
        "type": "integer", "minimum": 0, "default": 0, "run_arg": "--fake-every", "description": "a fake setting"}
    # generated, no edit: the typed config and the doc
    module = types.ModuleType("fake_settings")
    monkeypatch.setitem(sys.modules, "fake_settings", module)  # dataclasses resolve the annotations there
    exec(compile(settings_codegen.generate(schema), "fake_settings.py", "exec"), module.__dict__)
    assert "| `profiling.fake_every` | integer >= 0 | `0` | `--fake-every` | a fake setting |" in settings_codegen.generate_doc(schema)

    # 2. the RunConfig field
    @dataclass(frozen=True)
    class FakeRunConfig(RunConfig):
        fake_every: int = field(default=0, metadata=arg("--fake-every", "a fake setting", default="0", parse=int))

    given = module.SiteConfig.of(validated(minimal(profiling={"fake_every": 7}), schema), "")
    assert given.profiling.fake_every == 7
    options = swf.rung_options(given, schema)
    assert options == " --fake-every 7"
    # what the rung rule runs: its shared arguments, then the options (the `{params.device}` slot)
    filled = {"{params.spec:q}": "vit-debug/ddp/fp32/pre-lag/n1/b4", "{params.steps}": "6", "{params.warmup}": "2",
              "{params.data:q}": "synthetic", "{params.workers}": "0", "{params.seed}": "0", "{output:q}": str(tmp_path / "r.h5")}
    line = rule_args(FakeRunConfig)
    for k, v in filled.items():
        line = line.replace(k, v)
    parser = argparse.ArgumentParser()
    add_arguments(parser, FakeRunConfig)
    cfg = config_from_args(parser.parse_args(shlex.split(line + options)), FakeRunConfig)
    # 3. where the rank reads it
    assert isinstance(cfg, FakeRunConfig) and cfg.fake_every == 7
    assert cfg.argv()[-2:] == ["--fake-every", "7"]  # launch and maxbatch pass it on to the ranks
    # at its default: no option, so the rules' commands, and every finished rung, are as they were
    default = module.SiteConfig.of(validated(minimal(), schema), "")
    assert swf.rung_options(default, schema) == ""
    assert rule_args(FakeRunConfig) == RUNG_ARGS
