"""The planner without torch: what the workflow needs on a login node while it builds its DAG.

``scaleladder.site.plan.predict`` (and the ``plan`` command with its charts) must import and
run with torch unimportable. That rests on three things this file pins down: the stored
parameter layouts (``planner/layouts.json``) equal a fresh meta build of every flavor,
and the two numbers the planner restates from ``batches`` (which imports torch) — the
synthetic pool and the masked-token counts — equal the runner's.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaleladder.flavors import FLAVORS

SPECS = ["flava-900m/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8", "flava-350m/ddp/bf16-mixed/pre-lag/n1/bmax",
         "vit-15b/fsdp-hybrid4-ac/bf16-mixed/pre-lag/n2/b32", "vit-debug/fsdp-grad-op/fp32/pre-lag/n1/b4",
         # bf16-true's fp32 masters and their step transient are planned without scaleladder.rung.optim (torch)
         "vit-1b/fsdp-full-ac/bf16-true/pre-lag/n1/b1"]

NO_TORCH = """
import json, sys
for name in ("torch", "torchvision", "torchmultimodal"):
    sys.modules[name] = None  # `import torch` now raises ImportError
from scaleladder.site.plan import fits_table, predict
from scaleladder.spec import RunSpec

out = {}
for path in json.loads(sys.argv[1]):
    spec = RunSpec.from_path(path)
    p = predict(spec, spec.nodes * 8, 8, "a100-40gb", data=sys.argv[2])
    out[path] = [p.peak_bytes, p.max_batch, p.phase]
out["table"] = [[c.model, c.strategy, c.fits, c.max_batch] for c in fits_table("mi250x-gcd", 1, 8, batch=32)]
assert not any(m.split(".")[0] == "torch" and sys.modules[m] is not None for m in sys.modules)
print(json.dumps(out))
"""


@pytest.mark.process
@pytest.mark.parametrize("data", ["synthetic", "shards/manifest.json"])
def test_predict_runs_without_torch_and_agrees_with_it(data: str) -> None:
    from scaleladder.site.plan import fits_table, predict
    from scaleladder.spec import RunSpec

    proc = subprocess.run([sys.executable, "-c", NO_TORCH, json.dumps(SPECS), data], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for path in SPECS:
        spec = RunSpec.from_path(path)
        p = predict(spec, spec.nodes * 8, 8, "a100-40gb", data=data)
        assert got[path] == [p.peak_bytes, p.max_batch, p.phase], path
    assert got["table"] == [[c.model, c.strategy, c.fits, c.max_batch] for c in fits_table("mi250x-gcd", 1, 8, batch=32)]


@pytest.mark.process
def test_the_plan_command_draws_its_chart_without_torch(tmp_path: Path) -> None:
    chart = tmp_path / "fits.pdf"
    code = ("import sys\nfor m in ('torch', 'torchvision', 'torchmultimodal'): sys.modules[m] = None\n"
            "from scaleladder.cli import main\n"
            f"sys.exit(main(['plan', '--fits-chart', {str(chart)!r}, '--device', 'a100-40gb', '--nodes', '1', '--gpus-per-node', '8']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert chart.read_bytes()[:5] == b"%PDF-"


@pytest.mark.process
def test_a_flavor_with_no_stored_layout_says_how_to_fix_it_without_torch() -> None:
    code = ("import dataclasses, sys\nsys.modules['torch'] = None\n"
            "from scaleladder.flavors import get_flavor\nfrom scaleladder.planner.inventory import inventory\n"
            "try:\n    inventory(dataclasses.replace(get_flavor('vit-debug'), hidden=48))\n"
            "except ImportError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "python -m scaleladder.planner.inventory" in proc.stdout and "vit-debug" in proc.stdout


@pytest.mark.parametrize("name", sorted(FLAVORS))
def test_stored_layouts_equal_a_fresh_meta_build(name: str) -> None:
    # Regenerate with `python -m scaleladder.planner.inventory` when a flavor or torchmultimodal changes.
    from scaleladder.planner.inventory import build_inventory, stored_inventory

    flavor = FLAVORS[name]
    assert stored_inventory(flavor) == build_inventory(flavor)


def test_a_changed_flavor_is_not_served_a_stale_layout() -> None:
    from scaleladder.planner.inventory import build_inventory, inventory, stored_inventory

    wider = dataclasses.replace(FLAVORS["vit-debug"], hidden=48)
    assert stored_inventory(wider) is None
    assert inventory(wider) == build_inventory(wider) != inventory("vit-debug")


def test_the_runner_and_the_planner_share_one_synthetic_layout() -> None:
    from scaleladder.models import batch_layout
    from scaleladder.models.families import flava
    from scaleladder.planner import activations, step_setup
    from scaleladder.rung import batches

    # one definition, imported by both (no restated copies to drift apart): the runner's samples
    # are the family's (models/families/flava.py)
    assert step_setup.SYNTHETIC_POOL is batch_layout.SYNTHETIC_POOL
    assert activations.masked_counts is flava.masked_counts is batch_layout.masked_counts
    assert inspect.signature(batches.SyntheticBatches).parameters["pool"].default == batch_layout.SYNTHETIC_POOL
