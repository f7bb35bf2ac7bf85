"""The traced memory model (campaign/plan_trace.py): what `scaleladder plan` predicts for a model
family without an analytic model, held against the analytic planner and against real tensors.

* Against the analytic planner, where both exist (``plan --traced`` on ViT and FLAVA): the peak at
  the rung's batch and the max batch on a device within 5%. The analytic planner is itself within
  5% of torch's tracker on these (docs/planner.md, "Validation"), and the trace is that tracker
  extrapolated, so 5% is the two models' agreement, not a looser bound. Where the analytic planner
  is known to leave the tracker by more (a 1 MiB debug model at batch 8, where its conservative
  backward transients weigh; flava-debug's bf16 activations past batch 8), the case is a strict
  xfail naming the gap: it fails the day the planner closes it.
* Against torch's MemTracker on REAL CPU tensors (the runner's steps trained for real, at a batch
  neither trace ran): within 10%, for a family of this file's own (no analytic model, so the
  trace is all the planner has), and for every entry of examples/models.yaml (timm,
  transformers, the user's python). A CPU rung records no allocator peak, so MemTracker's peak
  is the reference.

Every trace here runs in this process (fake process group, no process started); one cache folder
serves the whole file, so a rung traced by one test is read by the next. The accuracy cases that
take 5-10 s each on the 2-core dev-cpu (vit-base, flava-debug, timm's ConvNeXt: tracing them, or
training them for real under the tracker) are ``slow``: `make test` runs them, `make test-fast`
keeps the mechanisms (vit-debug, the file's own family, the other entries, the cache, the command).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from scaleladder import flavors
from scaleladder.campaign.plan_check import run_steps
from scaleladder.campaign.plan_trace import TRACE_BATCHES, analytic, cache_path, predict, torch_version, trace, traced_rung
from scaleladder.flavors import Flavor
from scaleladder.models import families as family_module
from scaleladder.models.build import TrainModule
from scaleladder.models.family import Family
from scaleladder.planner.memory import custom_device
from scaleladder.planner.memory import predict as analytic_predict
from scaleladder.spec import RunSpec, SpecError

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "models.yaml"
ANALYTIC_TOLERANCE = 0.05
REAL_TOLERANCE = 0.10
REAL_BATCH = 24  # neither of TRACE_BATCHES: the extrapolation is what is checked


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan-traces")


# -- a family of this file's own ----------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm residual MLP over tokens: what FSDP wraps, AC checkpoints."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class TokenMLP(TrainModule):
    def __init__(self, flavor: Flavor, width: int, depth: int, patch: int) -> None:
        super().__init__()
        self.flavor, self.layer_cls = flavor, Block
        self.embed = nn.Conv2d(3, width, patch, patch)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, flavor.num_classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.embed(batch["image"]).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x.mean(1)).float(), batch["label"])


class TokenMLPFamily(Family):
    name, inputs = "token-mlp", "image"

    def build(self, flavor: Flavor, device: Any, options: Any) -> TrainModule:
        with torch.device(device):
            return TokenMLP(flavor, 96, 3, 4)

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        return {Block}

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, torch.Tensor]:
        s = flavor.image_size
        return {"image": torch.randn(3, s, s, generator=g), "label": torch.randint(flavor.num_classes, (), generator=g)}


TOKEN_MLP = Flavor("token-mlp-test", "token-mlp", image_size=32, num_classes=10)


@pytest.fixture
def own_family(monkeypatch: pytest.MonkeyPatch) -> Flavor:
    """TOKEN_MLP known to the spec and its family to family_of, for this test only."""
    monkeypatch.setitem(flavors._TABLE, TOKEN_MLP.name, TOKEN_MLP)
    monkeypatch.setitem(family_module._LOADED, TOKEN_MLP.family, TokenMLPFamily())
    return TOKEN_MLP


@pytest.fixture
def models_file(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """examples/models.yaml's entries registered for this test only (the registry restored after)."""
    from types import MappingProxyType

    from scaleladder.models.models_file import register_models_file

    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))
    monkeypatch.setattr(family_module, "_LOADED", dict(family_module._LOADED))
    return sorted(register_models_file(EXAMPLES))


SLOW_ENTRIES = {"convnext-atto"}  # timm's ConvNeXt: ~10 s, most of it its real steps under the tracker


def _example_entries() -> list[Any]:
    """The names of examples/models.yaml, read as text (no registration at collection)."""
    if not EXAMPLES.is_file():
        return [pytest.param("none", marks=pytest.mark.skip(reason="no examples/models.yaml"))]
    import yaml

    names = sorted(yaml.safe_load(EXAMPLES.read_text()) or {})
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ENTRIES else n for n in names]


# -- traced against analytic --------------------------------------------------------------------

H100 = "h100-80gb"
TINY = custom_device("tiny-0.505gib", 0.505)  # ~5 MiB above the planner's 0.5 GiB context: a debug model's max batch is ~60

ANALYTIC_CASES = [
    pytest.param("vit-debug/single/fp32/pre-lag/n1/b32", TINY, id="vit-debug-single"),
    pytest.param("vit-debug/fsdp2-full/fp32/pf1/n1/b32", TINY, id="vit-debug-fsdp2-full"),
    pytest.param("vit-base/single/bf16-mixed/pre-lag/n1/b32", H100, id="vit-base-single", marks=pytest.mark.slow),
    pytest.param("vit-base/fsdp2-full/bf16-mixed/pf1/n1/b32", H100, id="vit-base-fsdp2-full", marks=pytest.mark.slow),
    pytest.param("flava-debug/single/bf16-mixed/pre-lag/n1/b4", TINY, id="flava-debug-single", marks=pytest.mark.slow),
    pytest.param("vit-debug/fsdp2-full/fp32/pf1/n1/b8", TINY, id="vit-debug-b8-planner-transients",
                 marks=pytest.mark.xfail(strict=True, reason="the analytic planner is 10% above torch's tracker on "
                                         "vit-debug at batch 8: ~100 KB of conservative backward transients on 1 MiB")),
    pytest.param("flava-debug/single/bf16-mixed/pre-lag/n1/b16", None, id="flava-debug-b16-planner-under",
                 marks=[pytest.mark.slow, pytest.mark.xfail(strict=True, reason="the analytic planner is 10% under "
                                                            "torch's tracker on flava-debug bf16-mixed at batch 16")]),
]


@pytest.mark.parametrize("spec_path,device", ANALYTIC_CASES)
def test_traced_agrees_with_the_analytic_planner(spec_path: str, device: Any, cache: Path) -> None:
    spec = RunSpec.from_path(spec_path)
    dev = device or H100
    traced = predict(spec, 1, 1, dev, cache=cache).prediction
    planned = analytic_predict(spec, 1, 1, dev)
    assert traced.peak_bytes == pytest.approx(planned.peak_bytes, rel=ANALYTIC_TOLERANCE), (traced, planned)
    if device is not None:
        assert traced.max_batch is not None and planned.max_batch is not None
        assert traced.max_batch == pytest.approx(planned.max_batch, rel=ANALYTIC_TOLERANCE), (traced, planned)
    assert traced.breakdown["params"] == planned.breakdown["params"]  # the parameters, to the byte


def test_ddp_is_traced_as_single_plus_its_buckets(cache: Path) -> None:
    ddp = RunSpec.from_path("vit-debug/ddp/fp32/pre-lag/n1/b32")
    single = RunSpec.from_path("vit-debug/single/fp32/pre-lag/n1/b32")
    b = predict(single, 1, 1, H100, cache=cache)
    a = predict(ddp, 2, 2, H100, cache=cache)
    assert a.cache_file == b.cache_file and a.cached  # the single's trace serves the ddp rung
    buckets = a.trace.trainable * 4
    assert a.prediction.peak_bytes - b.prediction.peak_bytes == buckets
    planned = analytic_predict(ddp, 2, 2, H100)
    assert a.prediction.peak_bytes == pytest.approx(planned.peak_bytes, rel=ANALYTIC_TOLERANCE)


@pytest.mark.slow
def test_traced_flops_agree_with_the_analytic_count(cache: Path) -> None:
    from scaleladder.flavors import get_flavor
    from scaleladder.models.flops import vit_flops

    tr, _, _ = trace(RunSpec.from_path("vit-base/single/bf16-mixed/pre-lag/n1/b32"), 1, cache=cache)
    fc = vit_flops(get_flavor("vit-base"))
    assert tr.flops_per_sample == pytest.approx(fc.hardware, rel=0.02)  # CPU attention counted as the GPU's
    assert tr.forward_flops_per_sample == pytest.approx(fc.forward, rel=0.02)
    assert tr.width == 768  # the rate is read at the model's width, as the analytic path reads it
    assert 1000 < tr.aten_ops < 2000  # benchmarks' host table: 1,209 for vit-base single in fp32


# -- extrapolated against real tensors ----------------------------------------------------------


@pytest.mark.parametrize("strategy", ["single/fp32/pre-lag", "single-ac/bf16-mixed/pre-lag", "fsdp2-full/fp32/pf1"])
def test_own_family_extrapolates_to_real_tensors(strategy: str, own_family: Flavor, cache: Path) -> None:
    assert not analytic(own_family)
    spec = RunSpec.from_path(f"{own_family.name}/{strategy}/n1/b{REAL_BATCH}")
    traced = predict(spec, 1, 1, H100, cache=cache)
    assert REAL_BATCH not in traced.trace.batches
    torch.manual_seed(0)
    real = run_steps(spec, 1, REAL_BATCH, fake=False).peak_total
    assert traced.prediction.peak_bytes == pytest.approx(real, rel=REAL_TOLERANCE), (traced.prediction.peak_bytes, real)


@pytest.mark.parametrize("name", _example_entries())
def test_models_file_entries_extrapolate_to_real_tensors(name: str, models_file: list[str], cache: Path) -> None:
    from scaleladder.flavors import get_flavor

    assert name in models_file
    flavor = get_flavor(name)
    source = json.loads(flavor.entry).get("source")
    if source in ("timm", "transformers"):
        pytest.importorskip(source)
    assert not analytic(flavor)
    spec = RunSpec.from_path(f"{name}/single/fp32/pre-lag/n1/b{REAL_BATCH}")
    traced = predict(spec, 1, 1, H100, cache=cache)
    torch.manual_seed(0)
    real = run_steps(spec, 1, REAL_BATCH, fake=False).peak_total
    assert traced.prediction.peak_bytes == pytest.approx(real, rel=REAL_TOLERANCE), (traced.prediction.peak_bytes, real)
    assert traced.trace.flops_per_sample > 0 and traced.trace.aten_ops > 0


# -- the cache, the strategies, the command -----------------------------------------------------


def test_a_trace_is_cached_and_a_stale_one_ignored(own_family: Flavor, tmp_path: Path) -> None:
    spec = RunSpec.from_path(f"{own_family.name}/single/fp32/pre-lag/n1/b8")
    first, path, hit = trace(spec, 1, cache=tmp_path)
    assert not hit and path.is_file() and path.parent == tmp_path
    again, _, hit = trace(spec, 1, cache=tmp_path)
    assert hit and again.moments == first.moments and again.batches == TRACE_BATCHES
    # another torch: the entry is ignored and traced again
    data = json.loads(path.read_text())
    data["torch"] = "0.0.0"
    path.write_text(json.dumps(data))
    _, _, hit = trace(spec, 1, cache=tmp_path)
    assert not hit and json.loads(path.read_text())["torch"] == torch_version()
    # the key: another precision or world is another file; the batch is not part of it
    other = RunSpec.from_path(f"{own_family.name}/single/bf16-mixed/pre-lag/n1/b8")
    assert cache_path(traced_rung(other, 1), "sdpa", tmp_path) != path
    assert cache_path(traced_rung(RunSpec.from_path(f"{own_family.name}/single/fp32/pre-lag/n1/b64"), 1), "sdpa", tmp_path) == path


def test_what_cannot_be_traced_is_refused_or_traced_as_the_planner_plans_it() -> None:
    compiled = traced_rung(RunSpec.from_path("vit-debug/fsdp2-full-compile/fp32/pf1/n1/b8"), 8)
    assert str(compiled.spec.strategy) == "fsdp2-full" and compiled.world == 8 and "eager" in compiled.notes[0]
    ddp = traced_rung(RunSpec.from_path("vit-debug/ddp-ac/fp32/pre-lag/n1/b8"), 8)
    assert str(ddp.spec.strategy) == "single-ac" and ddp.world == 1 and ddp.ddp
    with pytest.raises(SpecError, match="FSDP1 on 2 ranks cannot be traced"):
        traced_rung(RunSpec.from_path("vit-debug/fsdp-full/fp32/pre-lag/n1/b8"), 2)


def test_plan_json_says_what_was_traced(own_family: Flavor, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scaleladder.cli import main as cli

    spec = f"{own_family.name}/fsdp2-full/fp32/pf1/n1/bmax"
    assert cli(["plan", "--spec", spec, "--device", "cpu", "--gpus-per-node", "1", "--trace-cache", str(cache), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["traced"] == ["memory", "flops", "host_ops"] and out["memory_model"].startswith("traced")
    assert out["trace"]["batches"] == list(TRACE_BATCHES) and out["max_batch"] is None  # the cpu device: unlimited
    assert out["step_time_s"] > 0 and any("traced aten ops" in s for s in out["step_time_sources"])
    # an analytic family, forced: the same fields, beside what the analytic plan says
    assert cli(["plan", "--spec", "vit-debug/single/fp32/pre-lag/n1/b32", "--device", "h100-80gb", "--gpus-per-node", "1", "--traced",
                "--trace-cache", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "memory: TRACED (vit-debug/single/fp32/pre-lag at world 1, local batches 4 and 8" in text
    assert "step time:" in text
    assert cli(["plan", "--spec", f"{own_family.name}/single/fp32/pre-lag/n1/b4", "--check"]) == 2
    assert "token-mlp-test has no analytic model" in capsys.readouterr().err
