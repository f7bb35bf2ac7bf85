"""Which parameters a flavor has, which FSDP unit owns each, and in what order FSDP flattens them.

The planner needs the *layout*, not just a count (FSDP1 pads each parameter inside its
unit's flat parameter; frozen parameters get no gradient or state). It builds a reduced
copy of the flavor (one layer per encoder) on the meta device, ``full = root + codebook +
n_layers × layer``, with units and freezing as ``rung.parallelize`` makes them. Without torch it
reads the stored ``layouts.json`` (``python -m scaleladder.planner.inventory`` writes it).
Why: docs/planner-internals.md, "1. Parameters, exactly".
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from scaleladder.flavors import Flavor, get_flavor
from scaleladder.models.families import family_of
from scaleladder.spec import AnyKnobs, check_unit_layers


@dataclass(frozen=True)
class ParamInfo:
    name: str
    numel: int
    trainable: bool  # requires grad once the runner has frozen the codebook and the unused heads
    cast: bool  # autocast caches a low-precision copy (a trainable Linear/Conv weight or bias)
    dim0: int = 0  # size of dim 0 (FSDP2 shards each parameter on it); 0: unknown, taken as numel (1-D)

    @property
    def rows(self) -> int:
        """Rows along dim 0 (FSDP2's Shard(0)); a parameter of numel N has N // rows elements per row."""
        return self.dim0 or self.numel


@dataclass(frozen=True)
class UnitLayout:
    kind: str  # "root" | "layer" | "codebook"
    params: tuple[ParamInfo, ...]  # FSDP's flattening order

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def trainable_numel(self) -> int:
        return sum(p.numel for p in self.params if p.trainable)

    @property
    def cast_numel(self) -> int:
        return sum(p.numel for p in self.params if p.cast)

    @property
    def requires_grad(self) -> bool:
        # FSDP1 gives the flat parameter requires_grad if any of its parameters has it.
        return any(p.trainable for p in self.params)


@dataclass(frozen=True)
class Inventory:
    flavor: Flavor
    root: UnitLayout
    layer: UnitLayout  # the layout of every transformer layer of this flavor
    codebook: UnitLayout | None  # FLAVA's frozen DALL-E encoder
    n_layers: int
    buffer_bytes: int  # registered buffers (position ids): never sharded, tiny
    frozen: tuple[UnitLayout, ...] = ()  # FSDP1 only (fsdp1_units): the unused heads and poolers, a unit each

    def units(self) -> list[UnitLayout]:
        """Every FSDP unit: root, then the layers, then the codebook (then FSDP1's frozen units).

        A unit per layer. FSDP2's units of k layers (knobs ``-u<k>``: :func:`layer_units`) hold
        the same per-parameter shards, so what a rank stores is the same whatever k; the step's
        gathers and reductions are per unit (planner/step_setup.py: ``StepSetup.unit_layers``)."""
        out = [self.root] + [self.layer] * self.n_layers
        return out + ([self.codebook] if self.codebook is not None else []) + list(self.frozen)

    @property
    def numel(self) -> int:
        return sum(u.numel for u in self.units())

    @property
    def trainable_numel(self) -> int:
        return sum(u.trainable_numel for u in self.units())

    @property
    def cast_numel(self) -> int:
        return sum(u.cast_numel for u in self.units())


def n_layers(flavor: Flavor) -> int:
    """Transformer layers: every stack's (``Family.layer_counts``: ViT depth; FLAVA image + text
    encoders + multimodal fusion)."""
    return sum(family_of(flavor).layer_counts(flavor))


def layer_units(flavor: Flavor, knobs: AnyKnobs) -> list[list[int]]:
    """The transformer layers (their indices, stacks in ``Family.layer_counts`` order) in FSDP units
    of ``knobs.unit_layers`` consecutive layers per stack, the last unit of a stack holding the
    remainder: rung.parallelize.unit_groups, torch-free. A unit per layer at k = 1. A k larger than
    a stack is refused here as in the runner (spec.check_unit_layers)."""
    counts = family_of(flavor).layer_counts(flavor)
    check_unit_layers(flavor.name, knobs, counts)
    k = knobs.unit_layers
    out: list[list[int]] = []
    start = 0
    for n in counts:
        out += [list(range(start + i, start + min(i + k, n))) for i in range(0, n, k)]
        start += n
    return out


def is_unused(flavor: Flavor, name: str) -> bool:
    """Whether ``name`` is a parameter training never uses: the family's ``unused_prefixes``
    (FLAVA's heads and poolers; rung.unused_params finds the same set empirically with a CPU step
    on flava-debug, too slow to pay for every plan; tests/test_plan.py checks that the two agree)."""
    return name.startswith(family_of(flavor).unused_prefixes)


def fsdp1_units(inv: Inventory) -> Inventory:
    """The units FSDP1 builds: each unused (frozen) head or pooler out of the root, a unit of its own.

    rung.parallelize.wrap_fsdp gives every outermost all-frozen module a unit, because a
    FlatParameter without use_orig_params must be all trainable or all frozen; FLAVA's
    are exactly the modules named by its family's unused_prefixes (tests/test_plan_exact.py holds the
    bytes to the real flat parameters). The root keeps its order minus those parameters.
    """
    prefixes = family_of(inv.flavor).unused_prefixes
    if not prefixes or inv.frozen:
        return inv
    groups: dict[str, list[ParamInfo]] = {}
    for p in inv.root.params:
        pre = next((x for x in prefixes if p.name.startswith(x)), None)
        if pre is not None:
            groups.setdefault(pre, []).append(p)
    root = UnitLayout("root", tuple(p for p in inv.root.params if not is_unused(inv.flavor, p.name)))
    frozen = tuple(UnitLayout("frozen", tuple(g)) for g in groups.values())
    return dataclasses.replace(inv, root=root, frozen=frozen)


def _unit_of(name: str, layer_prefixes: list[str], codebook_prefix: str | None) -> str:
    if codebook_prefix is not None and name.startswith(codebook_prefix):
        return "codebook"
    if any(name.startswith(p) for p in layer_prefixes):
        return "layer"
    return "root"


def inventory(model: str | Flavor) -> Inventory:
    """The parameter layout of ``model`` (a flavor or its name): stored, else a reduced meta build."""
    return _inventory(get_flavor(model) if isinstance(model, str) else model)


@cache
def _inventory(flavor: Flavor) -> Inventory:
    stored = stored_inventory(flavor)
    if stored is not None:
        return stored
    try:
        return build_inventory(flavor)
    except ImportError as e:
        raise ImportError(f"{flavor.name}: no stored layout matches this flavor and building one needs torch ({e}); "
                          "regenerate the table with `python -m scaleladder.planner.inventory` where torch is installed") from e


def build_inventory(flavor: Flavor) -> Inventory:
    """The layout from a reduced copy of the model built on the meta device (needs torch)."""
    from torch import nn

    from scaleladder.models.build import build_model

    family = family_of(flavor)
    reduced = family.reduced(flavor)  # one layer per stack
    m = build_model(reduced, "meta")
    unused = {n for n, _ in m.named_parameters() if is_unused(flavor, n)}

    blocks = tuple(family.block_classes(m))
    layer_prefixes = [f"{n}." for n, mod in m.named_modules() if isinstance(mod, blocks)]
    codebook_prefix = family.codebook_prefix or None
    # A parameter is cast by autocast when a Linear/Conv uses it — checked on every module,
    # since the shared MLM decoder bias is first reached through the head that owns it.
    cast_ids = {id(p) for mod in m.modules() if isinstance(mod, (nn.Linear, nn.Conv2d)) for p in mod.parameters(recurse=False)}

    units: dict[str, list[list[ParamInfo]]] = {"root": [[]], "layer": [], "codebook": [[]]}
    seen: set[int] = set()
    current_layer: str | None = None
    for mod_name, mod in m.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue  # FSDP flattens a shared parameter once
            seen.add(id(p))
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            unit = _unit_of(full, layer_prefixes, codebook_prefix)
            trainable = unit != "codebook" and full not in unused
            info = ParamInfo(full, p.numel(), trainable, trainable and id(p) in cast_ids, int(p.shape[0]) if p.dim() else 1)
            if unit == "layer":
                prefix = next(pre for pre in layer_prefixes if full.startswith(pre))
                if prefix != current_layer:
                    units["layer"].append([])
                    current_layer = prefix
                units["layer"][-1].append(info)
            else:
                units[unit][0].append(info)

    # Every layer of the reduced model must have one and the same layout (sizes, order).
    shapes = {tuple((p.numel, p.trainable, p.cast) for p in layer) for layer in units["layer"]}
    if len(shapes) != 1:
        raise AssertionError(f"{flavor.name}: transformer layers differ in layout; the planner assumes one layout per flavor")
    layer = UnitLayout("layer", tuple(units["layer"][0]))
    codebook = UnitLayout("codebook", tuple(units["codebook"][0])) if codebook_prefix else None
    buffer_bytes = sum(b.numel() * b.element_size() for b in m.buffers())
    return Inventory(flavor, UnitLayout("root", tuple(units["root"][0])), layer, codebook, n_layers(flavor), buffer_bytes)


# -- the stored table (torch-free planning) ------------------------------------------------

TABLE = Path(__file__).with_name("layouts.json")


def _fingerprint(flavor: Flavor) -> str:
    # Every field of the flavor: any change to it may change the layout, so the entry is
    # then ignored (and rebuilt with torch) until the table is regenerated.
    return repr(flavor)


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    if not TABLE.is_file():
        return {}
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


def _unit_from(kind: str, rows: list[list[Any]]) -> UnitLayout:
    # Rows are [name, numel, trainable, cast, dim0] (dim0: FSDP2's shard dimension's size).
    return UnitLayout(kind, tuple(ParamInfo(str(r[0]), int(r[1]), bool(r[2]), bool(r[3]), int(r[4]) if len(r) > 4 else 0)
                                  for r in rows))


def stored_inventory(flavor: Flavor) -> Inventory | None:
    """The stored layout of ``flavor``, or None when there is none for exactly this flavor."""
    table = _table()
    entry = table.get("flavors", {}).get(flavor.name)
    if entry is None or entry["fingerprint"] != _fingerprint(flavor):
        return None
    units = table["units"]
    codebook = _unit_from("codebook", units[entry["codebook"]]) if entry["codebook"] else None
    return Inventory(flavor, _unit_from("root", units[entry["root"]]), _unit_from("layer", units[entry["layer"]]),
                     codebook, int(entry["n_layers"]), int(entry["buffer_bytes"]))


def table_of(flavors: list[Flavor]) -> dict[str, Any]:
    """The JSON table for ``flavors``: identical unit layouts (FLAVA's codebook) stored once."""
    units: dict[str, list[list[Any]]] = {}
    ids: dict[str, str] = {}

    def ref(unit: UnitLayout | None, flavor: Flavor) -> str:
        if unit is None:
            return ""
        rows = [[p.name, p.numel, p.trainable, p.cast, p.dim0] for p in unit.params]
        key = json.dumps(rows)
        if key not in ids:
            ids[key] = f"{flavor.name}/{unit.kind}"
            units[ids[key]] = rows
        return ids[key]

    out: dict[str, Any] = {}
    for f in flavors:
        inv = build_inventory(f)
        out[f.name] = {"fingerprint": _fingerprint(f), "n_layers": inv.n_layers, "buffer_bytes": inv.buffer_bytes,
                       "root": ref(inv.root, f), "layer": ref(inv.layer, f), "codebook": ref(inv.codebook, f)}
    return {"generated_by": "python -m scaleladder.planner.inventory", "flavors": out, "units": units}


def write_table(path: Path = TABLE) -> None:
    from scaleladder.flavors import FLAVORS

    t = table_of(list(FLAVORS.values()))
    # One flavor, one parameter per line: diffs of the table stay readable.
    flavors = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in t["flavors"].items())
    units = ",\n".join(f"  {json.dumps(k)}: [\n" + ",\n".join(f"    {json.dumps(r)}" for r in rows) + "\n  ]"
                        for k, rows in t["units"].items())
    path.write_text(f'{{"generated_by": {json.dumps(t["generated_by"])},\n"flavors": {{\n{flavors}\n}},\n"units": {{\n{units}\n}}}}\n')


if __name__ == "__main__":
    write_table(Path(sys.argv[1]) if len(sys.argv) > 1 else TABLE)
    print(f"wrote {sys.argv[1] if len(sys.argv) > 1 else TABLE}")
