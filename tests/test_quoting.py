"""A path is a path: every user value that reaches a rule's shell line arrives as
ONE argument, intact, and nothing in it runs.

Each rule that carries a config value is run for real by Snakemake, with `site.scaleladder`
replaced by a recorder that writes its argv and exits: the shard rules (one job, and
slices + gather), the convergence rung and the aggregate. The hostile value holds spaces,
both quotes, `;`, `$(...)` and backticks, each of which would run a command if unquoted; a
newline is refused before any job (the pipeline cannot carry it: workflow.check_data_values).
Last, the workstation ladder runs for real from a folder with a space in its name.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, VENV_BIN, snakemake, workflow_copy
from scaleladder.site import commands as swf
from scaleladder.site import config as site_config
from scaleladder.site.settings import SiteConfig

# Each of these would create a CANARY file if a shell ever ran it.
HOSTILE = "my imgs; touch CANARY_1 $(touch CANARY_2) `touch CANARY_3` 'q' \"dq\" & touch CANARY_4 |"

RECORDER = """import json, os, sys
with open(os.environ["SCALELADDER_ARGV_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(3)
"""


def canaries(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("CANARY*")]


def recorded(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def after(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next option."""
    i = argv.index(flag) + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, Path]:
    """An image folder, a captions file, a vocab and two 'shards' whose names are HOSTILE."""
    root = tmp_path / "data"
    (root / HOSTILE).mkdir(parents=True)
    files = {"images": root / HOSTILE}
    for key in ("captions", "vocab", "wds0", "wds1", "train", "test"):
        files[key] = root / f"{key} {HOSTILE}.txt"
        files[key].write_text("x\n")
    return files


def recording_config(tmp_path: Path, wfdir: Path, extra: dict) -> tuple[Path, dict[str, str]]:
    """A config file (not --config: values given there take another road, refused for these
    characters) that swaps scaleladder for the recorder; and the environment it logs to."""
    rec = tmp_path / "recorder.py"
    rec.write_text(RECORDER)
    log = tmp_path / "argv.jsonl"
    cfg = {"site": {"scaleladder": f"{shlex.quote(sys.executable)} {shlex.quote(str(rec))}"}, **extra}
    (wfdir / "hostile.json").write_text(json.dumps(cfg))
    return log, {"SCALELADDER_ARGV_LOG": str(log)}


def data_config(files: dict[str, Path], **more: object) -> dict:
    return {"data": {"images": str(files["images"]), "captions": str(files["captions"]), "vocab": str(files["vocab"]),
                     "wds": [str(files["wds0"]), str(files["wds1"])], **more}}


def run_recorded(wfdir: Path, target: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return snakemake(wfdir, target, "--profile", "profiles/local", "--configfile", "profiles/local/site.yaml",
                     "hostile.json", check=False, timeout=300, **env)


def assert_sources_intact(argv: list[str], files: dict[str, Path]) -> None:
    assert after(argv, "--images") == [str(files["images"])]
    assert after(argv, "--captions") == [str(files["captions"])]
    assert after(argv, "--vocab") == [str(files["vocab"])]
    assert after(argv, "--wds") == [str(files["wds0"]), str(files["wds1"])]


# -- the params the rules build: shell-quoted, each value one word -----------------------------


@pytest.mark.process
def test_shard_sources_are_each_one_word_through_a_real_shell(tmp_path: Path) -> None:
    value = HOSTILE + "\nsecond line"  # a newline too: quoting carries it (the config check refuses it)
    data = {"images": value, "captions": value, "wds": [value, "b " + value], "vocab": value}
    site = {"name": "t", "ranks_per_node": 1, "scaleladder": "scaleladder", "launcher": "", "supervise": "launch"}
    ladders = [{"models": ["vit-debug"], "strategies": ["single"], "batches": [2]}]
    line = swf.shard_sources(SiteConfig.of({"site": site, "ladders": ladders, "steps": 2, "warmup": 1, "data": data}, ""))
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + line], cwd=tmp_path, capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:-1] == ["--images", value, "--captions", value, "--wds", value, "b " + value,
                                             "--vocab", value]
    assert not canaries(tmp_path)


# -- what the pipeline cannot carry is refused before any job, naming the key -------------------


@pytest.mark.parametrize("key", ["images", "captions", "vocab"])
def test_a_newline_in_a_data_path_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(site_config.ConfigError, match=rf"config key 'data\.{key}': .*control character"):
        site_config.check_data_values({"data": {key: "/data/a\nb"}})


def test_a_newline_in_a_wds_url_or_converge_manifest_is_refused() -> None:
    with pytest.raises(site_config.ConfigError, match=r"config key 'data\.wds\[1\]'"):
        site_config.check_data_values({"data": {"wds": ["a.tar", "b\n.tar"]}})
    with pytest.raises(site_config.ConfigError, match=r"config key 'converge\.test'"):
        site_config.check_data_values({"converge": {"test": "m\r.json"}})


def test_dollar_or_quote_given_with_dash_dash_config_is_refused_but_not_in_a_file(hostile: dict[str, Path]) -> None:
    cfg = {"data": {"images": str(hostile["images"])}}
    site_config.check_data_values(cfg)  # from a config file: carried, quoted
    with pytest.raises(site_config.ConfigError, match=r"config key 'data\.images': .*--configfile"):
        site_config.check_data_values(cfg, cli_config={"data": {"images": str(hostile["images"])}})


def test_a_missing_image_folder_is_refused_when_the_dag_is_built(tmp_path: Path) -> None:
    with pytest.raises(site_config.ConfigError, match=r"config key 'data\.images': no such folder"):
        site_config.check_data_values({"data": {"images": str(tmp_path / "nope")}})


@pytest.mark.process
def test_snakemake_refuses_a_newline_before_any_job(wf: Path, tmp_path: Path, hostile: dict[str, Path]) -> None:
    log, env = recording_config(tmp_path, wf, {"data": {"images": str(hostile["images"]) + "\nx"}})
    run = run_recorded(wf, "results/shards/32px/manifest.json", env)
    assert run.returncode != 0
    assert "config key 'data.images'" in run.stdout + run.stderr
    assert not recorded(log), "no job may run"


# -- each rule's shell line, run by Snakemake -----------------------------------------------------


@pytest.mark.process
def test_shard_rule_carries_every_source_intact(wf: Path, tmp_path: Path, hostile: dict[str, Path]) -> None:
    log, env = recording_config(tmp_path, wf, data_config(hostile))
    run = run_recorded(wf, "results/shards/32px/manifest.json", env)
    assert run.returncode != 0  # the recorder fails the job on purpose
    (argv,) = recorded(log)
    assert argv[0] == "shard"
    assert_sources_intact(argv, hostile)
    assert not canaries(wf, tmp_path)


@pytest.mark.process
def test_slice_and_gather_rules_carry_every_source_intact(wf: Path, tmp_path: Path, hostile: dict[str, Path]) -> None:
    log, env = recording_config(tmp_path, wf, data_config(hostile, slices=2))
    run_recorded(wf, "results/shards/32px.parts/slice-0000-of-0002.json", env)
    # the gather job needs the slice records: make them, and only the gather runs
    parts = wf / "results/shards/32px.parts"
    parts.mkdir(parents=True, exist_ok=True)
    for k in range(2):
        (parts / f"slice-{k:04d}-of-0002.json").write_text("{}")
    run_recorded(wf, "results/shards/32px/manifest.json", env)
    argvs = recorded(log)
    assert [a[0] for a in argvs] == ["shard", "shard"]
    assert "--slice" in argvs[0] and "--gather" in argvs[1]
    for argv in argvs:
        assert_sources_intact(argv, hostile)
    assert not canaries(wf, tmp_path)


@pytest.mark.process
def test_converge_rung_carries_its_manifests_intact(wf: Path, tmp_path: Path, hostile: dict[str, Path]) -> None:
    converge = {"converge": {"enabled": True, "strategies": ["single"], "precisions": ["fp32"],
                             "train": str(hostile["train"]), "test": str(hostile["test"])}}
    log, env = recording_config(tmp_path, wf, converge)
    run_recorded(wf, "results/converge/rungs/single/fp32/s0.h5", env)
    (argv,) = recorded(log)
    assert argv[0] == "converge"
    assert after(argv, "--data") == [str(hostile["train"])]
    assert after(argv, "--test-data") == [str(hostile["test"])]
    assert not canaries(wf, tmp_path)


@pytest.mark.process
def test_aggregate_carries_the_provenance_intact(wf: Path, tmp_path: Path, hostile: dict[str, Path]) -> None:
    from conftest import write_rung

    ladder = {"steps": 4, "warmup": 1, "ladders": [{"models": ["vit-debug"], "strategies": ["ddp"], "batches": [4]}]}
    log, env = recording_config(tmp_path, wf, {**ladder, **data_config(hostile, source="synthetic")})
    write_rung(wf, "vit-debug/ddp/fp32/pre-lag/n1/b4")
    run_recorded(wf, "results/ladder.h5", env)
    (argv,) = recorded(log)
    assert argv[0] == "aggregate"
    provenance = json.loads(after(argv, "--provenance")[0])
    assert provenance["data"]["images"] == str(hostile["images"])
    assert provenance["data"]["wds"] == [str(hostile["wds0"]), str(hostile["wds1"])]
    assert not canaries(wf, tmp_path)


# -- a working directory with a space ---------------------------------------------------------------

SMALL = """
steps: 4
warmup: 1
ladders:
  - models: [vit-debug]
    strategies: [ddp]
    batches: [4]
"""


@pytest.mark.process
@pytest.mark.slow
def test_make_run_from_a_folder_with_a_space(tmp_path: Path) -> None:
    """`make run` (the README's command) from a checkout in '/tmp/.../a b/', on a one-rung
    ladder: the venv path has the space too (a link to this venv, so nothing is installed:
    `make setup`'s own lines are quoted alike but not run here)."""
    root = workflow_copy(tmp_path / "a b" / "scaleladder")
    for name in ("Makefile", "pyproject.toml"):
        (root / name).write_bytes((REPO / name).read_bytes())
    (root / "containers").mkdir()
    (root / "containers/constraints-cuda.txt").write_bytes((REPO / "containers/constraints-cuda.txt").read_bytes())
    venv = Path(VENV_BIN).parent
    (root / ".venv").symlink_to(venv)
    assert (venv / ".installed").exists(), "make setup first"
    (root / "small.yaml").write_text(SMALL)
    env = dict(os.environ, PATH=os.environ.get("PATH", ""))
    # -o: never remake .venv/.installed here: that would `pip install -e` this venv from the copy
    run = subprocess.run(["make", "-o", ".venv/.installed", "run",
                          "SNAKEMAKE_ARGS=--configfile profiles/local/site.yaml small.yaml"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    for out in ("results/ladder.h5", "results/report.html", "results/plots/throughput_by_model.png",
                "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5"):
        assert (root / out).exists(), out
