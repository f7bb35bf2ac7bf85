"""The model families (models/family.py, models/families/): the house asks a family, never its
name; each built-in family builds its debug flavor, gives its stacks and its synthetic sample;
its torch-free facts agree with what it builds; and a family with no analytic FLOP count is
counted as the analytic count would be."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from scaleladder.flavors import get_flavor
from scaleladder.models.families import BUILT_IN, family_of
from scaleladder.models.family import Family

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "scaleladder"
#: Where a family may be named: the families themselves, the interface, and the size table.
ALLOWED = ("models/families/", "models/family.py", "flavors.py")
NAMES = {"flava", "vit"}


def _named(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place that names a family: a string constant that is a family's name,
    and a comparison on an attribute called ``family`` (``flavor.family == ...``, ``... in ...``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
            found.append((node.lineno, f"the string {node.value!r}"))
        elif isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr == "family"
                                                   for x in (node.left, *node.comparators)):
            found.append((node.lineno, f"a comparison on .family: {ast.unparse(node)}"))
    return found


def test_no_module_outside_the_families_names_a_family() -> None:
    """What differs by model is the family's (a ClassVar, a method): a module that branches on a
    family's name has a branch a new family cannot reach."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        offenders += [f"src/scaleladder/{rel}:{line}: {what}" for line, what in _named(ast.parse(path.read_text()))]
    assert not offenders, "name no family here; ask family_of(flavor) instead:\n" + "\n".join(offenders)


def test_the_check_sees_what_it_says() -> None:
    code = ('if flavor.family == "flava": pass\nx = f.family in BUILT_IN\nimpl = "flava_impl"\n'
            'y = {"vit": 1}\nz = flavor.family\n')
    assert sorted(line for line, _ in _named(ast.parse(code))) == [1, 1, 2, 4]


def test_the_families_import_no_torch_at_import_time() -> None:
    """The planner and the workflow's process read families torch-free: torch only inside methods
    (or for type checking)."""
    for path in [PACKAGE / "models" / "family.py", *sorted((PACKAGE / "models" / "families").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        top = []
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                top += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.append(node.module)
        assert not [m for m in top if m.split(".")[0] in ("torch", "torchmultimodal", "torchvision")], (path.name, top)


EXPECTED = {
    # family: (debug flavor, its stacks' lengths, its synthetic sample's keys)
    "vit": ("vit-debug", [2], {"image", "label"}),
    "flava": ("flava-debug", [2, 2, 1],  # image, text, multimodal
              {"image", "image_for_codebook", "image_patches_mask", "text", "text_masked", "mlm_labels", "itm_labels"}),
}


def test_every_built_in_family_is_checked_here() -> None:
    assert set(EXPECTED) == set(BUILT_IN)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_a_built_in_family_builds_its_debug_flavor_with_its_stacks_and_samples(name: str) -> None:
    flavor_name, stacks, keys = EXPECTED[name]
    flavor = get_flavor(flavor_name)
    family = family_of(flavor)
    assert isinstance(family, Family) and family.name == name == flavor.family and family.analytic
    model = family.build(flavor, "meta", {})
    assert all(p.is_meta for p in model.parameters())
    got = family.stacks(model)
    assert [len(s) for s in got] == stacks == family.layer_counts(flavor)  # the planner's count is the build's
    blocks = tuple(family.block_classes(model))
    assert all(isinstance(b, blocks) for s in got for b in s)
    sample = family.synthetic_sample(flavor, torch.Generator().manual_seed(0), 0)
    assert set(sample) == keys
    s = flavor.image_size
    assert sample["image"].shape == (3, s, s) and sample["image"].dtype == torch.float32
    # the same generator state gives the same sample (world-size invariance rests on it: rung/batches.py)
    again = family.synthetic_sample(flavor, torch.Generator().manual_seed(0), 0)
    assert all(torch.equal(sample[k], again[k]) for k in keys)
    # a reduced copy (the planner's inventory) has one block per stack
    reduced = family.reduced(flavor)
    assert [len(s) for s in family.stacks(family.build(reduced, "meta", {}))] == [1] * len(stacks)


def test_flava_has_its_codebook_as_an_extra_unit_and_vit_none() -> None:
    vit, flava = get_flavor("vit-debug"), get_flavor("flava-debug")
    assert family_of(vit).extra_unit_classes(family_of(vit).build(vit, "meta", {})) == set()
    extra = family_of(flava).extra_unit_classes(family_of(flava).build(flava, "meta", {}))
    assert [c.__name__ for c in extra] == ["DalleVAEEncoder"]


@pytest.mark.parametrize("recompute", [False, True])
def test_counted_flops_are_the_analytic_count_on_vit(recompute: bool) -> None:
    """What a family with no analytic count gets (rung/run.py: FlopCounterMode on a meta copy, on
    the first batch): on vit-debug, the analytic count exactly, recompute included."""
    from scaleladder.models.flops import counted_flops, vit_flops
    from scaleladder.rung.batches import synthetic_batch

    flavor = get_flavor("vit-debug")
    family = family_of(flavor)
    model = family.build(flavor, "meta", {})
    counted = counted_flops(model, [b for s in family.stacks(model) for b in s], synthetic_batch(flavor, 4, 0, 0, 0),
                            recompute, flavor.name)
    assert counted == pytest.approx(vit_flops(flavor, recompute))


def test_a_depthwise_convolutions_weight_gradient_is_counted_with_its_groups() -> None:
    """torch's FlopCounterMode counts a grouped convolution's weight gradient over every channel pair
    (groups times over); the count a family without an analytic one gets counts it as the forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from scaleladder.models.flops import _conv_backward_flops

    backward = {}
    for groups in (1, 64):
        conv = torch.nn.Conv2d(64, 64, 7, padding=3, groups=groups)
        x = torch.randn(2, 64, 16, 16, requires_grad=True)
        counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops})
        with counter:
            y = conv(x)
            forward = counter.get_total_flops()
            y.sum().backward()
        backward[groups] = (forward, counter.get_total_flops() - forward)
    for forward, back in backward.values():
        assert back == 2 * forward  # input gradient + weight gradient, each what the forward multiplies
    assert backward[1][0] == 64 * backward[64][0]
