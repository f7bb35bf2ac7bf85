"""`scaleladder models`: every flavor with its parameter count, built on the meta device.

The meta device gives shapes without storage, so even ViT-15B and FLAVA-10B are
counted in a second with no memory used. With ``--models FILE`` (the CLI registers the
file first: cli.MODELS_FLAG), the file's entries instead, each built on meta by its family
(models/sources/): a library's fault in an entry (a timm name timm lacks, a config class
transformers lacks) is said here, in one line, before any rung builds it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from scaleladder.flavors import FLAVORS, Flavor
from scaleladder.models.build import meta_parameter_count

GIB = 2**30


@dataclass(frozen=True)
class Row:
    name: str
    family: str
    params: int
    fp32_gib: float
    seed: str  # what the seed's table says, as printed there
    deviation_pct: float | None  # ours vs the seed's most precise column


def entry_parameter_count(flavor: Flavor) -> int:
    """Parameters of a models-file entry, built on meta by its family (tied ones counted once)."""
    from scaleladder.models.build import count_parameters
    from scaleladder.models.families import family_of

    return count_parameters(family_of(flavor).build(flavor, "meta", {}))


def row(flavor: Flavor) -> Row:
    n = entry_parameter_count(flavor) if flavor.entry else meta_parameter_count(flavor)
    gib = n * 4 / GIB
    if flavor.seed_size_gib is not None:  # FLAVA: the size column is the precise one
        return Row(flavor.name, flavor.family, n, gib, f"{flavor.seed_size_gib} GB", 100 * (gib / flavor.seed_size_gib - 1))
    if flavor.seed_params_m is not None:
        return Row(flavor.name, flavor.family, n, gib, f"{flavor.seed_params_m:g}M", 100 * (n / 1e6 / flavor.seed_params_m - 1))
    return Row(flavor.name, flavor.family, n, gib, "-", None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    models = getattr(args, "models", None)
    if models:  # the file's entries, in its order (already registered by the CLI)
        from scaleladder.models.models_file import load_models_file

        flavors = list(load_models_file(models).values())
    else:
        flavors = list(FLAVORS.values())
    rows = [row(f) for f in flavors]
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=1))
        return 0
    # the built-in table as docs/models.md shows it; a models file's names and sources are longer
    name_w = max(12, *(len(r.name) for r in rows)) if models else 12
    family_w = max(6, *(len(r.family) for r in rows)) if models else 6
    print(f"{'flavor':{name_w}s} {'family':{family_w}s} {'params':>14s} {'fp32':>9s} {'seed says':>10s} {'ours vs seed':>12s}")
    for r in rows:
        dev = f"{r.deviation_pct:+.1f}%" if r.deviation_pct is not None else "-"
        print(f"{r.name:{name_w}s} {r.family:{family_w}s} {r.params:14,d} {r.fp32_gib:7.2f}Gi {r.seed:>10s} {dev:>12s}")
    return 0
