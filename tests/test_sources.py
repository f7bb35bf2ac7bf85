"""The models-file sources (models/sources/): each source's model learns; built on meta and
materialised per module it holds what its library computes (no RoPE off, no dead layer scale);
its blocks are found; each library fault is one line naming the culprit; CLIP's gathered loss
at world 2 is single's."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from scaleladder.flavors import Flavor
from scaleladder.models.families import family_of
from scaleladder.models.family import Family
from scaleladder.models.init import materialize
from scaleladder.models.models_file import flavor_from_entry, load_models_file
from scaleladder.models.sources import family_for_entry, meta_init
from scaleladder.models.sources.common import BOS, EOS, causal_lm_loss
from scaleladder.spec import SpecError

REPO = Path(__file__).resolve().parents[1]
MODELS = load_models_file(REPO / "examples" / "models.yaml")


def batches(family: Family, flavor: Flavor, n: int = 2, size: int = 4) -> list[dict[str, torch.Tensor]]:
    out = []
    for s in range(n):
        samples = [family.synthetic_sample(flavor, torch.Generator().manual_seed(100 * s + i), i) for i in range(size)]
        out.append({k: torch.stack([x[k] for x in samples]) for k in samples[0]})
    return out


def train(model: nn.Module, pool: list[dict[str, torch.Tensor]], steps: int = 30) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # these models are too small to gain from more: a busy machine only slows them
    try:
        for step in range(steps):
            loss = model(pool[step % len(pool)])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def entry(model: str, **kw: object) -> Flavor:
    return flavor_from_entry(model, kw, None, "test")


@pytest.mark.parametrize("name", list(MODELS))
def test_each_source_learns(name: str) -> None:
    flavor = MODELS[name]
    family = family_of(flavor)
    torch.manual_seed(0)
    model = family.build(flavor, "cpu", {})
    assert model.flavor is flavor and isinstance(model.layer_cls, type)
    losses = train(model, batches(family, flavor))
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:2]) / 2, losses


@pytest.mark.parametrize("name", ["convnext-atto", "llama-tiny", "clip-tiny"])
def test_the_meta_path_keeps_what_the_library_computes(name: str) -> None:
    """Built on meta and materialised module by module with the family's reset, a library model
    holds its library's buffers and initial values, not models/init.py's zeros."""
    flavor = MODELS[name]
    family = family_of(flavor)
    torch.manual_seed(0)
    real = family.build(flavor, "cpu", {})
    with torch.device("meta"):  # as a caller may build: the family still keeps its buffers real
        meta = family.build(flavor, "meta", {})
    assert all(p.is_meta for p in meta.parameters()) and not any(b.is_meta for b in meta.buffers())
    assert meta_init.unreplayable(meta) == []
    materialize(meta, torch.device("cpu"), reset=family.reset_parameters)
    assert not any(p.is_meta for p in meta.parameters())
    for (n, b), (_, rb) in zip(meta.named_buffers(), real.named_buffers()):
        assert torch.equal(b, rb), n
    params = dict(meta.named_parameters())
    if name == "llama-tiny":
        inv_freq = meta.model.model.rotary_emb.inv_freq
        assert inv_freq.abs().min() > 0  # RoPE on
        norms = [m.weight for m in meta.modules() if type(m).__name__ == "LlamaRMSNorm"]
        assert norms and all(bool((w == 1).all()) for w in norms)
        std = params["model.model.layers.0.self_attn.q_proj.weight"].std().item()
        assert abs(std - 0.02) < 0.004  # initializer_range, not nn.Linear's kaiming
    if name == "clip-tiny":
        for tower in (meta.model.text_model, meta.model.vision_model):
            ids = tower.embeddings.position_ids
            assert torch.equal(ids[0], torch.arange(ids.shape[-1]))
        assert meta.model.logit_scale.shape == (1,)  # FSDP1 takes no 0-dim parameter
        assert torch.allclose(meta.model.logit_scale, real.model.logit_scale)
    if name == "convnext-atto":
        gammas = {n: p for n, p in params.items() if n.endswith(".gamma")}
        real_params = dict(real.named_parameters())
        assert gammas and all(torch.equal(p, real_params[n]) for n, p in gammas.items())
        assert all(bool((p == 1e-6).all()) for p in gammas.values())  # timm's layer scale, not 0: a live model
        assert abs(params["model.stem.0.weight"].std().item() - real_params["model.stem.0.weight"].std().item()) < 0.005
        losses = train(meta, batches(family, flavor), steps=20)
        assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:2]) / 2, losses


def test_blocks_and_stacks() -> None:
    found = {}
    for name in ("convnext-atto", "llama-tiny", "clip-tiny", "vit-hf-tiny", "my-model"):
        flavor = MODELS[name]
        family = family_of(flavor)
        model = family.build(flavor, "meta", {})
        found[name] = (sorted(c.__name__ for c in family.block_classes(model)), family.stacks(model), model)
    names, stacks, atto = found["convnext-atto"]
    assert names == ["ConvNeXtBlock"] and [len(s) for s in stacks] == [2, 2, 6, 2]
    assert stacks[0][0] is atto.model.stages[0].blocks[0]
    names, stacks, llama = found["llama-tiny"]
    assert names == ["LlamaDecoderLayer"] and stacks == [list(llama.model.model.layers)]
    names, stacks, clip = found["clip-tiny"]  # not CLIPTextEmbeddings, which _no_split_modules names too
    assert names == ["CLIPEncoderLayer"]
    assert stacks == [list(clip.model.text_model.encoder.layers), list(clip.model.vision_model.encoder.layers)]
    assert found["vit-hf-tiny"][0] == ["ViTLayer"]
    assert found["my-model"][0] == ["MixerBlock"] and [len(s) for s in found["my-model"][1]] == [4]


def test_synthetic_samples() -> None:
    for name, keys in (("convnext-atto", {"image", "label"}), ("llama-tiny", {"input_ids"}), ("clip-tiny", {"image", "input_ids"})):
        flavor = MODELS[name]
        family = family_of(flavor)
        a = family.synthetic_sample(flavor, torch.Generator().manual_seed(3), 0)
        b = family.synthetic_sample(flavor, torch.Generator().manual_seed(3), 0)
        assert set(a) == keys and all(torch.equal(a[k], b[k]) for k in a)
        if "image" in a:
            assert a["image"].shape == (3, flavor.image_size, flavor.image_size) and a["image"].dtype == torch.float32
        if "label" in a:
            assert a["label"].dtype == torch.int64 and a["label"].shape == ()
        if "input_ids" in a:
            ids = a["input_ids"]
            assert ids.shape == (flavor.text_len,) and ids.dtype == torch.int64
            assert ids[0] == BOS and ids[-1] == EOS and int((ids == EOS).sum()) == 1
    assert {family_of(MODELS[n]).inputs for n in ("convnext-atto", "llama-tiny", "clip-tiny")} == {"image", "text", "image-text"}


def test_text_models_take_the_project_tokenizers_ids() -> None:
    clip = family_of(MODELS["clip-tiny"]).build(MODELS["clip-tiny"], "meta", {})
    text = clip.model.config.text_config
    assert (text.pad_token_id, text.bos_token_id, text.eos_token_id, text.vocab_size) == (0, BOS, EOS, MODELS["clip-tiny"].vocab_size)
    llama = family_of(MODELS["llama-tiny"]).build(MODELS["llama-tiny"], "meta", {})
    assert llama.model.config.eos_token_id == EOS and llama.model.config.vocab_size == 1024


def test_the_causal_lm_loss_is_a_mean_per_sample() -> None:
    """Pads ignored, each sample's mean first: a rank's loss does not depend on its padding."""
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 3, 0, 0, 0]])
    per = [causal_lm_loss(logits[i:i + 1], ids[i:i + 1]) for i in range(2)]
    assert torch.allclose(causal_lm_loss(logits, ids), (per[0] + per[1]) / 2)


LIBRARY_FAULTS = {
    "timm name": ({"source": "timm", "name": "convnext_atoo"}, "model 'm' (timm entry): timm has no model 'convnext_atoo'; did you mean convnext_atto"),
    "timm kwargs": ({"source": "timm", "name": "convnext_atto", "kwargs": {"depthz": 3}}, "model 'm' (timm entry): timm.create_model('convnext_atto'"),
    "config class": ({"source": "transformers", "config": "LlamaConfg", "task": "causal-lm"},
                     "model 'm' (transformers entry): transformers has no configuration class 'LlamaConfg'; did you mean LlamaConfig"),
    "task": ({"source": "transformers", "config": "LlamaConfig", "task": "image-classification"},
             "model 'm' (transformers entry): LlamaConfig cannot serve task image-classification"),
    "towers": ({"source": "transformers", "config": "LlamaConfig", "task": "image-text-contrastive"},
               "model 'm' (transformers entry): LlamaConfig cannot serve task image-text-contrastive: its model LlamaModel has no text and image towers"),
    "declared blocks": ({"source": "timm", "name": "convnext_atto", "blocks": ["Block"]},
                        "model 'm' (timm entry): blocks Block name no module class of ConvNeXt"),
    "text_len": ({"source": "transformers", "config": "CLIPConfig", "task": "image-text-contrastive", "text_len": 100},
                 "model 'm' (transformers entry): text_len 100 exceeds its max_position_embeddings 77"),
}


@pytest.mark.parametrize("case", list(LIBRARY_FAULTS))
def test_library_faults_are_one_line(case: str) -> None:
    kw, message = LIBRARY_FAULTS[case]
    flavor = entry("m", **kw)
    with pytest.raises(SpecError) as e:
        family_for_entry(flavor).build(flavor, "meta", {})
    assert "\n" not in str(e.value) and str(e.value).startswith(message), str(e.value)


def test_no_blocks_found_says_what_to_declare() -> None:
    from scaleladder.models.sources.timm import timm_blocks
    from scaleladder.models.sources.transformers import repeated_layers

    for find in (timm_blocks, repeated_layers):
        with pytest.raises(SpecError, match=r"^x: no blocks found in Linear \(.*\); declare its repeated layer class in the entry"):
            find(nn.Linear(2, 2), "x")


def test_declared_blocks_are_used() -> None:
    flavor = entry("m", source="transformers", config="LlamaConfig", task="causal-lm",
                   kwargs={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
                   blocks=["LlamaMLP"])
    family = family_for_entry(flavor)
    assert {c.__name__ for c in family.block_classes(family.build(flavor, "meta", {}))} == {"LlamaMLP"}


GOOD = """
    import torch
    from torch import nn
    from scaleladder.models.build import TrainModule
    from scaleladder.models.family import Family

    class Net(TrainModule):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])
        def forward(self, batch):
            return self.layers[0](batch["x"]).sum()

    class Fam(Family):
        def __init__(self, blocks=None):
            self.blocks = blocks
        def build(self, flavor, device, options):
            return Net()
        def block_classes(self, model):
            return {self.blocks or nn.Linear}
        def synthetic_sample(self, flavor, g, global_index):
            return {"x": torch.randn(4, generator=g)}

    class Half(Family):
        def build(self, flavor, device, options):
            return Net()

    def make(**kw):
        return Fam(**kw)

    def conv(**kw):
        return Fam(blocks=nn.Conv2d)

    def half():
        return Half()

    def nothing():
        return 42

    def boom():
        raise RuntimeError("no GPU here\\nsecond line")
"""

PYTHON_FAULTS = {
    "no module": ("nowhere:make", "model 'm' (python entry): factory 'nowhere:make': module 'nowhere' cannot be imported"),
    "no function": ("{mod}:make_it", "model 'm' (python entry): factory '{mod}:make_it': module '{mod}' ("),
    "not a family": ("{mod}:nothing", "model 'm' (python entry): factory '{mod}:nothing' returned int, not a scaleladder.models.family.Family"),
    "raises": ("{mod}:boom", "model 'm' (python entry): factory '{mod}:boom'(**{{}}) raised RuntimeError: no GPU here"),
    "missing methods": ("{mod}:half", "model 'm' (python entry): factory '{mod}:half''s family Half does not define block_classes, synthetic_sample"),
    "no blocks": ("{mod}:conv", "model 'm' (python entry): no blocks found: block_classes() names Conv2d"),
}


@pytest.mark.parametrize("case", list(PYTHON_FAULTS))
def test_python_faults_are_one_line(tmp_path: Path, case: str) -> None:
    mod = f"user_family_{case.replace(' ', '_')}"  # a module name of its own: sys.modules keeps each
    (tmp_path / f"{mod}.py").write_text(textwrap.dedent(GOOD))
    factory, message = PYTHON_FAULTS[case]
    flavor = flavor_from_entry("m", {"source": "python", "factory": factory.format(mod=mod), "path": "."}, tmp_path, "t")
    with pytest.raises(SpecError) as e:
        family_for_entry(flavor).build(flavor, "cpu", {})
    assert "\n" not in str(e.value) and str(e.value).startswith(message.format(mod=mod)), str(e.value)


def test_a_python_family_is_filled_in(tmp_path: Path) -> None:
    (tmp_path / "user_family_good.py").write_text(textwrap.dedent(GOOD))
    flavor = flavor_from_entry("m", {"source": "python", "factory": "user_family_good:make", "path": "."}, tmp_path, "t")
    assert json.loads(flavor.entry)["path"] == str(tmp_path.resolve())
    family = family_for_entry(flavor)
    model = family.build(flavor, "cpu", {})
    assert model.flavor is flavor and model.layer_cls is nn.Linear  # filled in where the user's code left them out
    assert family.name == "m" and family.inputs == "image"


@pytest.mark.process
def test_clip_gathered_loss_at_world_2_is_singles(tmp_path: Path) -> None:
    """transformers' CLIP loss is per rank (no all-gather): its world-2 loss is not single's. The
    family's gathered loss is, and so are DDP's averaged gradients."""
    import torch.multiprocessing as mp

    from helpers.contrastive_worker import global_batch, rank_main

    flavor = MODELS["clip-tiny"]
    family = family_of(flavor)
    size = 8
    torch.manual_seed(0)
    single = family.build(flavor, "cpu", {})
    loss = single(global_batch(family, flavor, size))
    loss.backward()
    mp.spawn(rank_main, args=(2, flavor.name, flavor.entry, size, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for got in ranks:
        assert torch.allclose(got["loss"], loss.detach(), rtol=1e-5), (got["loss"], loss)
        grads = dict(single.named_parameters())
        assert set(got["grads"]) == {n for n, p in grads.items() if p.grad is not None}
        for n, g in got["grads"].items():
            assert torch.allclose(g, grads[n].grad, rtol=1e-4, atol=1e-6), n
    # what the per-rank loss would have been: each half on its own differs from the global loss
    half = {k: v[: size // 2] for k, v in global_batch(family, flavor, size).items()}
    assert not torch.allclose(single(half), loss)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made in a test leave the process's table as it was."""
    from types import MappingProxyType

    from scaleladder import flavors

    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))


def test_models_lists_the_files_entries(table: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scaleladder.cli import main
    from scaleladder.models.build import count_parameters

    assert main(["models", "--models", str(REPO / "examples" / "models.yaml"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(MODELS)
    for r in rows:
        flavor = MODELS[r["name"]]
        assert r["family"] == flavor.family
        assert r["params"] == count_parameters(family_of(flavor).build(flavor, "cpu", {}))  # meta counts what a real build holds
    bad = tmp_path / "bad.yaml"
    bad.write_text("m: {source: timm, name: convnext_atoo}\n")
    assert main(["models", "--models", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scaleladder models: error: model 'm' (timm entry): timm has no model 'convnext_atoo'") and err.count("\n") == 1
