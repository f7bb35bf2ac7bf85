"""Traced memory: the planner's model for a family that has no analytic one.

The analytic planner (``planner/``) exists for ViT and FLAVA. For any other family
(``models/family.py``: ``Family.analytic`` false: a models-file model) ``scaleladder plan``
traces instead: the runner's own steps on FAKE tensors under torch's memory tracker, as
``plan --check`` runs them (``campaign/plan_check.run_steps``: built on meta, each tensor an
empty fake one, wrapped by the runner's ``apply_strategy`` on the fake process group as rank 0
of the world, two steps of the runner's step, the second one kept), at the two local batches of
:data:`TRACE_BATCHES`. The tracker snapshots its categories at every moment it marks: before and
after each module call's forward and backward, and the peak within each (MemTracker's per-module
states), and the peaks of the step's two phases (forward + backward; the optimizer step). Each
moment's bytes are a line in the batch through the two traces, ``fixed + per_sample x b``; the
peak at any batch is the highest moment there (so a peak that moves from the end of backward at
a small batch to its start at a large one is followed, which one line through the two peaks
would not), and the max batch is the largest whose peak, with the planner's overheads, fits the
device. A third step, counted, gives FLOPs per sample (FlopCounterMode, forward + backward: what
ran, so activation checkpointing's recompute included), the step's top-level aten ops and the
width its matrix products run at, from which the step time is priced (:func:`step_time`).

Strategies the fake tensors cannot run are traced as the planner plans them: a ``ddp`` rung as
``single`` plus DDP's gradient buckets (DDP reads tensor data when it is built), a ``-compile``
rung as its eager rung (an upper bound). FSDP1 is traced on one rank only.

A trace costs seconds to a minute (docs/planner.md, "Traced memory"), so each is kept in a JSON
file, one per (model entry or flavor, traced strategy, precision, world, knobs, FLAVA
implementation), under ``--trace-cache`` (default ``$SCALELADDER_CACHE/plan-traces``, else
``$XDG_CACHE_HOME/scaleladder/plan-traces``, else ``~/.cache/scaleladder/plan-traces``: the
cache folder of ``rung/probe_cache.py``). A file records the torch version and a fingerprint of
the code that ran the trace; a file whose either differs is ignored and traced again. A plan read
from the cache imports no torch and no model library.

Who traces, who reads only the cache (:func:`traced_model` picks the traced planner: every
models-file model, decided from its entry alone): ``scaleladder plan --spec``, ``launch
--plan-device`` (the predicted-oom verdict, ``--plan-only`` too) and ``maxbatch``'s starting batch
trace a rung the cache lacks (they import torch anyway). What must stay torch-free and fast reads
the cache only (``cached_only``, :class:`NotTraced` on a miss) and says in one line what it could
not plan, with the command that traces it (:func:`trace_command`): the workflow's fit check while
the DAG is built (site/ladder.py), ``budget`` (campaign/cost.py), ``plan --fits-table``,
``--fits-chart``, ``--time-chart`` and ``--vs-measured``.

This module imports no torch at load (``scaleladder plan`` imports it to ask :func:`analytic`);
a trace imports it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from scaleladder.flavors import Flavor, get_flavor
from scaleladder.models.flava_impl import SDPA
from scaleladder.planner.fits import TABLE_STRATEGIES, FitsCell
from scaleladder.planner.memory import CALIBRATED, Device, Overheads, Prediction, largest_batch, required_bytes, resolve_device
from scaleladder.planner.rates import HostTable, Rates
from scaleladder.planner.steptime import Site, StepTime
from scaleladder.spec import RunSpec, SpecError, default_knobs, parse_strategy

#: The two local batches a rung is traced at. A fake tensor has no storage, so a trace costs the
#: same at any batch; 4 and 8 are past batch 1 and 2, where a 512-byte-rounded per-sample tensor
#: or a batch-1 special case would bend the line, and small enough for a generated input pool.
TRACE_BATCHES = (4, 8)

#: torch's tracker categories (MemTracker's, FSDPMemTracker's) as the planner's breakdown names them.
CATEGORY = {
    "Parameter": "params", "Sharded Param": "params", "Unsharded Param": "buffers", "Buffer": "buffers",
    "Gradient": "grads", "Sharded Grad": "grads", "Unsharded Grad": "grads",
    "Activation": "activations", "Temp": "activations", "All Gather": "buffers", "Reduce Scatter": "buffers",
    "Optstate": "optimizer", "OptState": "optimizer", "Inputs": "inputs", "Other": "inputs",
}

#: The code whose change makes a trace stale: the runner's wrapping, optimizer, precision and
#: batches, the models, and the trace itself (paths under src/scaleladder/; a folder: every .py in it).
CODE = ("campaign/plan_check.py", "campaign/plan_trace.py", "flavors.py", "models", "rung/parallelize.py",
        "rung/optim.py", "rung/precision.py", "rung/batches.py", "rung/unused_params.py", "rung/sac.py",
        "rung/what_ran.py")
#: Models-file sources whose families are the libraries' (models/sources/common.LibraryFamily): none analytic.
LIBRARY_SOURCES = ("timm", "transformers")
#: Libraries whose version is part of the fingerprint (models built by them).
LIBRARIES = ("timm", "transformers", "torchmultimodal", "torchmultimodal-nightly")


def analytic(flavor: Flavor) -> bool:
    """Whether the planner has an analytic memory model for ``flavor`` (its family's ``analytic``)."""
    from scaleladder.models.families import family_of

    if flavor.entry and json.loads(flavor.entry).get("source") in LIBRARY_SOURCES:
        return False  # read without importing the library (a cached plan then needs no torch)
    return family_of(flavor).analytic


def traced_model(flavor: Flavor) -> bool:
    """Whether the workflow, ``launch``, ``maxbatch`` and ``budget`` plan ``flavor`` by its trace:
    every models-file model (decided from its entry alone, so a python entry's module, and torch,
    are never imported for it), and a family without an analytic model."""
    return bool(flavor.entry) or not analytic(flavor)


class NotTraced(SpecError):
    """No usable cached trace of a rung, asked of the cache only (``cached_only``): none, or one
    written under another torch or by other code (``stale``)."""

    def __init__(self, spec: RunSpec, world: int, path: Path, stale: bool) -> None:
        self.spec, self.world, self.path, self.stale = spec, world, path, stale
        why = "a stale cached trace (another torch or other code)" if stale else "no cached trace"
        super().__init__(f"{spec.path}: {why} at world {world} in {path.parent}")


class Untraceable(SpecError):
    """A rung the fake tensors cannot trace (FSDP1 on more than one rank)."""


# -- the trace ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traced:
    """What was traced for a rung: the spec as run on fake tensors, the world, and why it differs."""

    spec: RunSpec
    world: int
    notes: tuple[str, ...] = ()
    ddp: bool = False  # add DDP's gradient buckets to the traced single's memory


def traced_rung(spec: RunSpec, world: int) -> Traced:
    """The rung the fake tensors run for ``spec`` at ``world`` ranks (module docstring)."""
    s, notes, ddp = spec.strategy, [], False
    if s.compile:
        s = replace(s, compile=False)
        notes.append(f"{spec.strategy} traced as its eager rung {s} (an upper bound: what inductor saves is not traced)")
    if s.wrapper == "ddp":
        s, ddp = replace(s, wrapper="single"), True
        notes.append("ddp traced as single plus DDP's gradient buckets (a second copy of the trainable gradients): "
                     "DDP reads tensor data when it is built, which fake tensors have not")
    if s.wrapper == "single":
        world = 1
    elif s.is_fsdp1 and world > 1:
        raise Untraceable(f"{spec.path}: FSDP1 on {world} ranks cannot be traced (fake tensors trace it on one rank "
                          "only); trace fsdp2 or plan at one rank")
    return Traced(RunSpec(spec.model, s, spec.precision, spec.knobs, spec.nodes, TRACE_BATCHES[0]), world, tuple(notes), ddp)


@dataclass
class Trace:
    """A rung's traced memory at the two batches, and its counted step. JSON as it is cached.

    ``moments``: the tracker's categories (bytes at each of the two batches) at the moments of the
    step that can hold its peak: the peaks of its two phases (``step|forward-backward|0``,
    ``step|optimizer|0``) and the per-module snapshots (``fqn|state|call``), only those whose line
    is the highest at some batch up to planner.memory.MAX_BATCH_LIMIT (the rest can never be the peak)."""

    rung: str  # the traced rung's model/strategy/precision/knobs
    world: int
    batches: tuple[int, int]
    moments: dict[str, dict[str, tuple[int, int]]]
    flops_per_sample: float  # FLOPs of forward + backward per sample (recomputed forwards included)
    forward_flops_per_sample: float
    width: int  # the FLOP-weighted median narrowest dimension of the step's matrix products (0: none)
    aten_ops: int  # top-level aten ops of one step
    trainable: int  # trainable elements on the rank
    storage_bytes: int  # bytes per parameter element (what DDP's buckets hold per trainable element)
    torch: str
    code: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    ddp_bucket_bytes: int = 0  # set for a ddp rung (not cached: the traced single's file serves it)

    def _line(self, pair: tuple[int, int], batch: int) -> float:
        (b1, b2), (v1, v2) = self.batches, pair
        return v1 + (v2 - v1) * (batch - b1) / (b2 - b1)

    def breakdown(self, batch: int, resident_inputs: float = 1.0) -> tuple[str, dict[str, float]]:
        """(the moment, the planner's breakdown) at the peak of the step at ``batch``: at each moment
        each category on its line through the two traces, the highest moment's sum the peak.
        ``resident_inputs`` scales the input batches on the device (the traces hold the synthetic pool).

        A moment that is a peak within a window (a phase, a module's backward) may fall at another
        point of the window at the other batch: its sum is then the secant of a convex function (the
        window's peak is the largest of lines), below the window's peak outside the two batches, so
        never above the true peak there; its categories may leave their lines (one shrinks as another
        grows), so a negative one counts 0 and the others are scaled to the sum."""
        best: tuple[str, dict[str, float], float] = ("", {}, -1.0)
        for moment, cats in self.moments.items():
            parts: dict[str, float] = {}
            for name, pair in cats.items():
                if name != "Total":
                    key = CATEGORY.get(name, "activations")
                    parts[key] = parts.get(key, 0.0) + self._line(pair, batch) * (resident_inputs if key == "inputs" else 1.0)
            total = sum(parts.values())
            if total > best[2]:
                best = (moment, parts, total)
        moment, parts, total = best
        positive = sum(v for v in parts.values() if v > 0)
        out = {k: v * total / positive if v > 0 and positive > 0 else 0.0 for k, v in parts.items()}
        if self.ddp_bucket_bytes:
            out["buffers"] = out.get("buffers", 0.0) + self.ddp_bucket_bytes
        return moment, out

    def peak(self, batch: int, resident_inputs: float = 1.0) -> float:
        return sum(self.breakdown(batch, resident_inputs)[1].values())

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("ddp_bucket_bytes")
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trace:
        d = dict(d)
        d["batches"] = tuple(d["batches"])
        d["moments"] = {m: {k: (int(v[0]), int(v[1])) for k, v in cats.items()} for m, cats in d["moments"].items()}
        return cls(**d)


def moment_name(moment: str) -> str:
    """``fqn|state|call`` as a phase: ``<state> of <fqn>`` (``, call N`` after the first)."""
    fqn, state, call = (moment.split("|") + ["", "0"])[:3]
    if fqn == "step":
        return state
    return f"{state} of {fqn}" + (f", call {int(call) + 1}" if call not in ("", "0") else "")


def envelope(moments: dict[str, dict[str, tuple[int, int]]], batches: tuple[int, int]) -> dict[str, dict[str, tuple[int, int]]]:
    """The moments whose total is the highest at some batch of a geometric grid from 1 to
    planner.memory.MAX_BATCH_LIMIT (steps of 1.25x, the traced batches included)."""
    from scaleladder.planner.memory import MAX_BATCH_LIMIT

    (b1, b2) = batches
    grid = {1, b1, b2}
    x = 1.0
    while x <= MAX_BATCH_LIMIT:
        grid.add(round(x))
        x *= 1.25

    def total(m: str, b: int) -> float:
        v1, v2 = moments[m].get("Total", (0, 0))
        return v1 + (v2 - v1) * (b - b1) / (b2 - b1)

    keep = {max(moments, key=lambda m: total(m, b)) for b in sorted(grid)}
    return {m: moments[m] for m in moments if m in keep}


def cache_dir(given: str | Path | None = None) -> Path:
    """``--trace-cache``, else the project's cache folder (rung/probe_cache.py) + ``plan-traces``."""
    if given:
        return Path(given)
    from scaleladder.rung.probe_cache import cache_dir as base

    return base() / "plan-traces"


def _model_key(flavor: Flavor) -> dict[str, Any]:
    """What names the model: its models-file entry, else its dimensions (a built-in flavor)."""
    if flavor.entry:
        return {"entry": flavor.entry}
    return {k: v for k, v in asdict(flavor).items() if k not in ("name", "seed_params_m", "seed_size_gib")}


def cache_path(t: Traced, flava_impl: str, folder: Path) -> Path:
    """The trace's file: the model, traced strategy, precision and world readable; a hash of the whole key."""
    flavor = get_flavor(t.spec.model)
    key = {"model": _model_key(flavor), "strategy": str(t.spec.strategy), "precision": t.spec.precision,
           "world": t.world, "knobs": str(t.spec.knobs), "flava_impl": flava_impl if _uses_flava_impl(flavor) else ""}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{t.spec.model}-{t.spec.strategy}-{t.spec.precision}-w{t.world}-{digest}.json"


def _uses_flava_impl(flavor: Flavor) -> bool:
    """Whether ``--flava-impl`` builds another model (a models-file entry's family never: asked without
    importing its library)."""
    from scaleladder.models.families import family_of

    return not flavor.entry and family_of(flavor).uses_flava_impl


def code_fingerprint(flavor: Flavor) -> str:
    """A hash of the code that runs a trace (:data:`CODE`), a python entry's own code (every .py
    under its ``path``), and the model libraries' versions. Read without importing any of them.
    The project's code and the libraries' versions are read once per process (the DAG build asks
    for every rung); a python entry's files every time."""
    h = hashlib.sha256(_installed_code())
    entry = json.loads(flavor.entry) if flavor.entry else {}
    own = Path(entry["path"]) if entry.get("source") == "python" and entry.get("path") else None
    if own is not None:
        for f in sorted(own.rglob("*.py")) if own.is_dir() else [own]:
            if f.is_file():
                h.update(f.read_bytes())
    h.update(_library_versions())
    return h.hexdigest()[:16]


@functools.cache
def _installed_code() -> bytes:
    """The :data:`CODE` files' paths and contents, hashed (once per process)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in CODE:
        path = root / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.digest()


@functools.cache
def _library_versions() -> bytes:
    out = b""
    for lib in LIBRARIES:
        try:
            out += f"{lib}={metadata.version(lib)}".encode()
        except metadata.PackageNotFoundError:
            pass
    return out


def torch_version() -> str:
    """The installed torch's version, read from its metadata: a cached trace is read without torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def _load(path: Path, torch_version: str, code: str) -> Trace | None:
    try:
        d = json.loads(path.read_text())
        trace = Trace.from_json(d)
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return None
    return trace if trace.torch == torch_version and trace.code == code else None


def trace(spec: RunSpec, world: int, flava_impl: str = SDPA, cache: str | Path | None = None,
          cached_only: bool = False) -> tuple[Trace, Path, bool]:
    """``spec``'s trace at ``world`` ranks: (the trace, its cache file, whether it came from there).
    A trace read from the cache imports no torch; with ``cached_only`` a miss is :class:`NotTraced`
    (nothing traced, nothing imported)."""
    t = traced_rung(spec, world)
    flavor = get_flavor(t.spec.model)
    path = cache_path(t, flava_impl, cache_dir(cache))
    code, version = code_fingerprint(flavor), torch_version()
    found = _load(path, version, code)
    hit = found is not None
    if found is None and cached_only:
        raise NotTraced(spec, t.world, path, path.is_file())
    if found is None:
        from scaleladder.campaign.plan_check import PHASES, run_steps
        from scaleladder.files import atomic_write_text
        from scaleladder.planner.static import storage_bytes

        t0 = time.perf_counter()
        b1, b2 = TRACE_BATCHES
        one = run_steps(t.spec, t.world, b1, flava_impl)
        two = run_steps(t.spec, t.world, b2, flava_impl, count=True)
        at = [{**{f"step|{ph}|0": s.phases[ph] for ph in PHASES}, **s.moments} for s in (one, two)]
        moments = {m: {k: (at[0][m].get(k, 0), at[1][m].get(k, 0)) for k in sorted(set(at[0][m]) | set(at[1][m]))}
                   for m in at[0] if m in at[1]}  # a moment of both traces (the same module call, the same state)
        found = Trace(f"{t.spec.model}/{t.spec.strategy}/{t.spec.precision}/{t.spec.knobs}", t.world, TRACE_BATCHES,
                      envelope(moments, TRACE_BATCHES), two.flops / b2, two.forward_flops / b2, round(two.width), two.aten_ops, two.trainable,
                      storage_bytes(t.spec.precision), version, code, round(time.perf_counter() - t0, 1))
        try:
            atomic_write_text(path, json.dumps(found.as_json(), indent=1) + "\n")
        except OSError:
            pass  # a cache that cannot be written: traced again next time, nothing lost
    found.notes = list(t.notes)
    found.ddp_bucket_bytes = found.trainable * found.storage_bytes if t.ddp else 0
    return found, path, hit


# -- the plan -------------------------------------------------------------------------------------


@dataclass
class TracedPlan:
    prediction: Prediction
    trace: Trace
    cache_file: Path
    cached: bool

    @property
    def memory_model(self) -> str:
        b1, b2 = self.trace.batches
        return (f"traced: torch's memory tracker on fake tensors at local batches {b1} and {b2}, each category "
                "extrapolated linearly in the batch (docs/planner.md, \"Traced memory\")")

    def fields(self) -> dict[str, Any]:
        """``plan --json``'s fields beside the prediction's: what was traced, at which batches, where kept."""
        t = self.trace
        return {"memory_model": self.memory_model, "traced": ["memory", "flops", "host_ops"],
                "trace": {"batches": list(t.batches), "rung": t.rung, "world": t.world, "torch": t.torch,
                          "flops_per_sample": t.flops_per_sample, "forward_flops_per_sample": t.forward_flops_per_sample,
                          "matmul_width": t.width, "aten_ops": t.aten_ops, "trainable_per_rank": t.trainable,
                          "seconds": t.seconds, "cache_file": str(self.cache_file), "cached": self.cached,
                          "notes": list(t.notes)}}

    def lines(self) -> list[str]:
        t = self.trace
        how = f"from the cache, {self.cache_file}" if self.cached else f"{t.seconds:.0f} s, kept in {self.cache_file}"
        out = [f"  memory: TRACED ({t.rung} at world {t.world}, local batches {t.batches[0]} and {t.batches[1]}; {how})",
               f"  FLOPs: {t.flops_per_sample:.4g} per sample, forward + backward (FlopCounterMode on the traced step)"]
        return out + [f"  note: {n}" for n in t.notes]


def predict(spec: RunSpec, world: int, ranks_per_node: int, device: str | Device, batch: int | None = None,
            data: str = "synthetic", flava_impl: str = SDPA, cache: str | Path | None = None,
            overheads: Overheads = CALIBRATED, cached_only: bool = False) -> TracedPlan:
    """The traced counterpart of ``planner.memory.predict``: the same :class:`Prediction`, its peak and
    breakdown from the trace (``phase`` says which phase of the step peaks, ``traced:`` first).
    ``cached_only``: from a cached trace or :class:`NotTraced` (torch-free)."""
    from scaleladder.models.batch_layout import SYNTHETIC_POOL
    from scaleladder.planner.step_setup import input_batches

    dev = resolve_device(device)
    if world < 1 or ranks_per_node < 1:
        raise SpecError(f"world ({world}) and ranks per node ({ranks_per_node}) must be >= 1")
    spec.strategy.check_world(world)
    tr, path, hit = trace(spec, world, flava_impl, cache, cached_only)
    resident = input_batches(data).resident / SYNTHETIC_POOL
    cap = dev.capacity_bytes
    mb = None if cap is None else largest_batch(lambda b: required_bytes(tr.peak(b, resident), world, overheads) <= cap)
    b = batch if batch is not None else (None if spec.batch == "max" else int(spec.batch))
    if b is None:
        b = mb if mb is not None else 1
    phase, parts = tr.breakdown(b, resident)
    peak = sum(parts.values())
    req = required_bytes(peak, world, overheads)
    breakdown = {k: int(round(v)) for k, v in parts.items()}
    breakdown["overhead"] = req - int(peak)
    p = Prediction(spec=spec.path, device=dev.name, world=world, ranks_per_node=ranks_per_node, batch=b, data=data,
                   peak_bytes=int(peak), required_bytes=req, capacity_bytes=cap, fits=cap is None or req <= cap,
                   max_batch=mb, phase=f"traced: {moment_name(phase)}", breakdown=breakdown)
    return TracedPlan(p, tr, path, hit)


# -- what fits where, traced ----------------------------------------------------------------------

#: A fits-table cell of a models-file model whose trace is not cached (``plan --fits-table`` says "no trace").
NO_TRACE = "no cached trace"


def fits_cells(models: Sequence[str], device: str | Device, nodes: int, gpus_per_node: int, precision: str,
               batch: int | None, data: str = "synthetic", strategies: Sequence[str] | None = None,
               cache: str | Path | None = None) -> tuple[list[FitsCell], dict[tuple[str, str], TracedPlan], list[NotTraced]]:
    """``planner.fits.fits_table``'s cells for models the planner traces, from CACHED traces only
    (torch-free, fast): (the cells, each planned cell's :class:`TracedPlan` by (model, strategy),
    the cells with no cached trace, whose cell says :data:`NO_TRACE`). A strategy the fake tensors
    cannot trace on this world (FSDP1) is a cell of its own reason, as one that cannot run there."""
    world = nodes * gpus_per_node
    cells: list[FitsCell] = []
    plans: dict[tuple[str, str], TracedPlan] = {}
    missing: list[NotTraced] = []
    for m in models:
        for s in strategies or TABLE_STRATEGIES:
            strat = parse_strategy(s)
            spec = RunSpec(m, strat, precision, default_knobs(strat), nodes, batch if batch is not None else "max")
            try:
                strat.check_world(world)
                tp = predict(spec, world, gpus_per_node, device, data=data, cache=cache, cached_only=True)
            except NotTraced as e:
                missing.append(e)
                cells.append(FitsCell(m, s, None, None, None, NO_TRACE))
                continue
            except SpecError as e:  # cannot run on this world, or cannot be traced there
                cells.append(FitsCell(m, s, None, None, None, str(e)))
                continue
            p = tp.prediction
            cells.append(FitsCell(m, s, p.fits if batch is not None else p.max_batch is not None, p.max_batch, p.peak_bytes))
            plans[(m, s)] = tp
    return cells, plans, missing


# -- what a cache-only caller says ----------------------------------------------------------------

#: A models file's place in a command when the caller does not know it (a rung known from its record).
MODELS_PLACEHOLDER = "<your models file>"


def trace_command(specs: Sequence[RunSpec], device: str, ranks_per_node: int, models_file: str | None,
                  cache: str | Path | None = None) -> str:
    """One shell line that traces ``specs`` into the cache as the caller planned them (``nodes x
    ranks_per_node`` ranks; a ``single`` rung at one, as ``plan`` wants it): ``scaleladder plan`` for
    one spec, a loop for more (one per ranks per node). ``device`` only names the plan's device (a
    trace does not depend on it)."""
    groups: dict[int, list[str]] = {}
    for s in specs:
        paths = groups.setdefault(1 if s.strategy.wrapper == "single" else ranks_per_node, [])
        if s.path not in paths:
            paths.append(s.path)
    out = []
    for rpn, paths in sorted(groups.items(), reverse=True):
        head = (["scaleladder", "plan", "--models", models_file or MODELS_PLACEHOLDER, "--device", device,
                 "--gpus-per-node", str(rpn)] + (["--trace-cache", str(cache)] if cache else []))
        if len(paths) == 1:
            out.append(shlex.join([*head, "--spec", paths[0]]))
        else:
            out.append(f"for s in {' '.join(shlex.quote(p) for p in paths)}; do {shlex.join(head)} --spec \"$s\"; done")
    return "; ".join(out)


def untraced_hint(missing: Sequence[NotTraced], device: str, ranks_per_node: int, models_file: str | None,
                  cache: str | Path | None = None) -> str:
    """Where the cache was read, how many traces it lacks (one per cache file: a ``ddp`` rung and
    its ``single`` share one) and the one command that makes them, for a note of the caller's."""
    first: dict[Path, NotTraced] = {}
    for m in missing:
        first.setdefault(m.path, m)
    stale = sum(m.stale for m in first.values())
    folder = next(iter(first)).parent if first else cache_dir(cache)
    return (f"{len(first)} trace(s) missing from {folder}"
            + (f" ({stale} of them stale: traced under another torch or by other code)" if stale else "")
            + f"; each takes seconds to a minute: {trace_command([m.spec for m in first.values()], device, ranks_per_node, models_file, cache)}")


# -- the step time --------------------------------------------------------------------------------


def host_seconds(spec: RunSpec, tr: Trace, rates: Rates, site: Site, table: HostTable | None = None) -> tuple[float, str]:
    """The step's host work from its traced top-level aten ops: x the host table's ms per op (the
    median over its rows of the rung's strategy, any model: the table's family-free figure) x the
    calibration host's ``table_factor`` x the site's ``cpu_factor``; where the calibration has no
    table factor, x its stated ``us_per_op``."""
    from scaleladder.planner.rates import host_table
    from scaleladder.planner.steptime import table_name

    name, _ = table_name(replace(spec.strategy, compile=False))
    ops = tr.aten_ops
    if rates.table_factor is not None:
        t = table or host_table()
        per = {n: [r["host_ms"] / r["aten_ops"] for (_, s, _), r in t.rows.items() if s == n and r.get("aten_ops")]
               for n in (name, "single")}
        use = name if per[name] else "single"
        if per[use]:
            ms = ops * statistics.median(per[use])
            return (ms * 1e-3 * rates.table_factor * site.cpu_factor,
                    f"host: {ops:,} traced aten ops x {statistics.median(per[use]) * 1e3:.1f} us ({t.where}: the median "
                    f"ms per op of its {use} rows, any model) x table_factor {rates.table_factor} ({rates.host_source}) "
                    f"x cpu_factor {site.cpu_factor} ({site.cpu_source})")
    s = ops * rates.us_per_op * 1e-6 * site.cpu_factor
    return s, (f"host: {ops:,} traced aten ops x {rates.us_per_op} us x {site.cpu_factor} ({site.cpu_source}); "
               f"{rates.host_source}")


def step_time(spec: RunSpec, world: int, batch: int, tr: Trace, rates: Rates, site: Site,
              table: HostTable | None = None) -> StepTime:
    """A traced rung's step time (planner/steptime.py's formula, its inputs traced): compute = the
    traced FLOPs at the device's rate for the traced matmul width, + fused AdamW's HBM traffic over
    the rank's trainable elements; host = :func:`host_seconds`. Communication is not modelled (its
    unit sizes come from the analytic inventory), said in the sources."""
    from scaleladder.planner.rates import OPT_BYTES_PER_PARAM

    width = tr.width or round(rates.h_half)  # no matrix product: the width at half the ceiling
    rate = rates.flops_per_s(width)
    gpu = batch * tr.flops_per_sample / rate
    opt_s = tr.trainable * OPT_BYTES_PER_PARAM / rates.hbm_bps
    sources = [f"compute: {batch * tr.flops_per_sample / 1e12:.3g} TFLOP (traced: FlopCounterMode, recomputed forwards "
               f"included) at {rate / 1e12:.3g} TFLOP/s for the traced matmul width {width}, "
               f"{rates.compute_source}; optimizer {opt_s * 1e3:.2f} ms of HBM traffic"]
    host, hsrc = host_seconds(spec, tr, rates, site, table)
    sources.append(hsrc)
    if world > 1 and spec.strategy.wrapper != "single":
        sources.append("communication: not modelled for a traced model (the collectives' sizes come from the "
                       "analytic inventory): step time is compute + host")
    device_s = gpu + opt_s
    if rates.device == "cpu":
        step, bound = host + device_s, "cpu"
    else:
        step, bound = max(host, device_s), ("host" if host > device_s else "gpu")
    return StepTime(step, device_s, host, 0.0, 0.0, bound, sources)


def step_fields(spec: RunSpec, world: int, batch: int | None, device: str, timing: Any, tr: Trace) -> dict[str, Any]:
    """``plan --json``'s step-time fields for a traced rung (as site/plan_time.step_fields)."""
    from scaleladder.planner.rates import rates

    if batch is None:
        return {"step_time_s": None, "step_time_parts": None, "step_time_sources": ["no batch fits: no step"]}
    try:
        r = rates(device, spec.precision, timing.calibration, timing.where)
    except SpecError as e:
        return {"step_time_s": None, "step_time_parts": None, "step_time_sources": [str(e)]}
    out: dict[str, Any] = step_time(spec, world, batch, tr, r, timing.site).as_dict()
    return out
