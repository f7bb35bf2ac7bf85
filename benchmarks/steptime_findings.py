"""The seeds' findings as predictions: what the step-time model and the memory
planner say, before anything runs, on the Frontier and A100 profiles.

    python benchmarks/steptime_findings.py     # one Markdown table, a row per claim

Each row gives the claim, the numbers the model predicts for it and whether they agree. A
claim the model does not predict stays in the table with its reason. Torch-free.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scaleladder.planner.memory import predict
from scaleladder.planner.rates import rates
from scaleladder.planner.steptime import Site, predict_step, site_from_config
from scaleladder.site.profiles import load_profile
from scaleladder.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
NODES = (1, 2, 4, 8)


def ips(path: str, device: str, site: Site, rpn: int) -> float | None:
    """Predicted items/s of all ranks (None: predicted not to fit)."""
    spec = RunSpec.from_path(path)
    world = spec.nodes * rpn
    if not predict(spec, world, rpn, device).fits:
        return None
    st = predict_step(spec, world, rpn, int(spec.batch), rates(device, spec.precision), site)
    return int(spec.batch) * world / st.step_time_s


def gib(path: str, device: str, rpn: int) -> float:
    spec = RunSpec.from_path(path)
    return predict(spec, spec.nodes * rpn, rpn, device).required_bytes / 2**30


def _fmt(x: float | None) -> str:
    return "OOM" if x is None else f"{x:,.0f}"


def _series(model: str, strategy: str, b: int, site: Site) -> list[float | None]:
    return [ips(f"{model}/{strategy}/bf16-mixed/pre-lag/n{n}/b{b}", "mi250x-gcd", site, 8) for n in NODES]


def rows() -> list[tuple[str, str, str]]:
    """Long because it is the table: five claims, each a few predictions and a verdict."""
    fr = site_from_config(load_profile("frontier", REPO).config, "frontier")
    a1 = site_from_config(load_profile("a100", REPO).config, "a100")
    out = []
    # 1. HYBRID 1GPU >= FULL_SHARD for models that fit one GCD
    cells, ok = [], True
    for m in ("vit-base", "vit-huge", "vit-1b"):
        h, f = _series(m, "fsdp-hybrid1", 32, fr), _series(m, "fsdp-full", 32, fr)
        ok &= all(x is not None and y is not None and x >= y for x, y in zip(h, f))
        cells.append(f"{m}: hybrid1 {'/'.join(map(_fmt, h))} vs full {'/'.join(map(_fmt, f))}")
    out.append(("HYBRID 1GPU at least as fast as FULL_SHARD for models that fit one GCD (ViT seed)",
                "; ".join(cells) + " items/s at 1/2/4/8 nodes, b32", "predicted" if ok else "NOT predicted"))
    # 2. HYBRID sharded within a node best for models that fit two GCDs (ViT-5B needs 2)
    strategies = ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid2", "fsdp-hybrid8", "ddp", "fsdp-no-shard", "fsdp-hybrid1")
    best: list[tuple[int, str, dict[str, float]]] = []
    for n in NODES:
        got = {s: ips(f"vit-5b/{s}/bf16-mixed/pre-lag/n{n}/b32", "mi250x-gcd", fr, 8) for s in strategies}
        fit = {s: v for s, v in got.items() if v is not None}
        best.append((n, max(fit, key=lambda s: fit[s]) if fit else "none", fit))
    # a tie counts (at one node hybrid8 IS full sharding over the node)
    ok = all(max(by.get("fsdp-hybrid2") or 0, by.get("fsdp-hybrid8") or 0) >= 0.995 * max(by.values()) for _, _, by in best if by)
    out.append(("HYBRID sharded within a node best for models that fit two GCDs (ViT-5B)",
                "; ".join(f"n{n}: best {b} (" + ", ".join(f"{s} {_fmt(v)}" for s, v in by.items()) + ")" for n, b, by in best),
                "predicted" if ok else "NOT predicted"))
    # 3. SHARD_GRAD_OP scales better than FULL_SHARD for models that fit half a node (ViT-15B needs 4 GCDs):
    # scaling efficiency from the fewest nodes where both fit to 8
    cells, verdicts = [], []
    for m, b in (("vit-15b", 8), ("vit-5b", 32)):
        g, f = _series(m, "fsdp-grad-op", b, fr), _series(m, "fsdp-full", b, fr)
        i = next((k for k in range(len(NODES)) if g[k] and f[k]), None)
        eff = [None, None] if i is None else [x[-1] / (NODES[-1] / NODES[i] * x[i]) for x in (g, f)]  # type: ignore[operator]
        verdicts.append(eff[0] is not None and eff[1] is not None and eff[0] > eff[1])
        cells.append(f"{m} b{b}: grad-op {'/'.join(map(_fmt, g))}, full {'/'.join(map(_fmt, f))}; efficiency to 8 nodes "
                     + " vs ".join("n/a" if e is None else f"{e:.3f}" for e in eff))
    out.append(("SHARD_GRAD_OP scales better than FULL_SHARD for models that fit half a node",
                "; ".join(cells), "predicted" if all(verdicts) else ("partly: " + ", ".join(
                    f"{m} {'yes' if v else 'no'}" for m, v in zip(("vit-15b", "vit-5b"), verdicts)))))
    # 4. FULL_SHARD's memory falls with nodes, HYBRID's stays flat
    full = [gib(f"vit-5b/fsdp-full/bf16-mixed/pre-lag/n{n}/b32", "mi250x-gcd", 8) for n in NODES]
    hyb = [gib(f"vit-5b/fsdp-hybrid8/bf16-mixed/pre-lag/n{n}/b32", "mi250x-gcd", 8) for n in NODES]
    ok = full[-1] < full[0] and abs(hyb[-1] - hyb[0]) < 0.01 * hyb[0]
    out.append(("FULL_SHARD's memory falls with nodes while HYBRID's stays flat (ViT-5B, GiB per GCD)",
                f"full {'/'.join(f'{x:.1f}' for x in full)}; hybrid8 {'/'.join(f'{x:.1f}' for x in hyb)} at 1/2/4/8 nodes",
                "predicted" if ok else "NOT predicted"))
    # 5. FLAVA seed: DDP >= FSDP at batch 8 on 8 A100s, small models
    cells, ok = [], True
    for m in ("flava-350m", "flava-900m"):
        d = ips(f"{m}/ddp/bf16-mixed/pre-lag/n1/b8", "a100-40gb", a1, 8)
        fs = ips(f"{m}/fsdp-full/bf16-mixed/pre-lag/n1/b8", "a100-40gb", a1, 8)
        ok &= d is not None and fs is not None and d >= fs
        cells.append(f"{m}: ddp {_fmt(d)}, fsdp-full {_fmt(fs)} items/s")
    out.append(("FLAVA seed: DDP at least as fast as FSDP at batch 8 on 8 A100s (small models)", "; ".join(cells),
                "predicted" if ok else "NOT predicted"))
    return out


def main() -> int:
    print("| seed's finding | the model's prediction | verdict |\n|---|---|---|")
    for claim, numbers, verdict in rows():
        print(f"| {claim} | {numbers} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
