"""The run spec: the one value that flows through scaleladder.

A rung is fully described by a :class:`RunSpec`, written once as a path
(``vit-base/fsdp-hybrid2-ac/bf16-mixed/pre-lag/n1/b32``, also the Snakemake wildcard path),
parsed once here (:meth:`RunSpec.from_path`, :func:`parse_strategy`, :func:`parse_knobs`)
and stored as HDF5 attributes; nothing else re-derives it. Each part round-trips through
``str()``; a part that parses but is not canonical (``fsdp-hybrid02``, ``n01``, ``b+8``) is
an error naming the canonical form. Grammar::

    strategy  <base>[-ac|-ac-reentrant|-sac][-compile]
              base: single | ddp | fsdp-full | fsdp-grad-op | fsdp-no-shard | fsdp-hybrid<g>
                    | fsdp2-full | fsdp2-grad-op | fsdp2-hybrid<g>
    precision fp32 | tf32 | bf16-mixed | fp16-mixed | bf16-true   (bf16: read as bf16-mixed, said once)
    knobs     FSDP1: <pre|post|none>-<lag|nolag>[-fwd]   FSDP2: pf<n>[-u<k>], n = 0 | 1 | 2
              others: pre-lag only (:func:`default_knobs`)
              -u<k>: k consecutive blocks of a stack per FSDP unit (:class:`Fsdp2Knobs`), k >= 2
              written, k = 1 (a unit per block, the seeds') never: no finished rung's path changes.
              FSDP1's grammar takes it too (``pre-lag-u2``) only to refuse it in one line
              (:data:`FSDP1_UNIT_REFUSAL`); a non-FSDP rung refuses it as any other knob.
    batch     a positive local (per-rank) batch, or max

What each name runs, and what is refused: docs/strategies.md.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

# SpecError is re-exported: `from scaleladder.spec import SpecError` is the usual import.
from scaleladder.errors import SpecError as SpecError
from scaleladder.flavors import get_flavor

#: torch.compile backends a -compile rung may use (rung.parallelize applies them; here so that the
#: CLI's choices need no torch)
COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager")

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true")
WRAPPERS: tuple[str, ...] = ("single", "ddp", "fsdp", "fsdp2")
SHARDINGS: tuple[str, ...] = ("full", "grad-op", "no-shard", "hybrid")  # FSDP1's ShardingStrategy
# fully_shard always shards (over the mesh's shard dimension): a NO_SHARD FSDP2 is DDP, and
# replicating over the world with shard groups of one is fsdp2-hybrid1.
FSDP2_SHARDINGS: tuple[str, ...] = ("full", "grad-op", "hybrid")
PREFETCHES: tuple[str, ...] = ("pre", "post", "none")
MAX_FSDP2_PREFETCH = 2  # pf0..pf2: units FSDP2 all-gathers ahead, explicitly (a unit: -u<k> blocks, 1 by default)
DEFAULT_KNOBS = "pre-lag"  # FSDP1's default, and the only knobs a non-FSDP rung accepts
DEFAULT_FSDP2_KNOBS = "pf0"

_STRATEGY_RE = re.compile(
    r"^(single|ddp|fsdp-(full|grad-op|no-shard|hybrid(\d+))|fsdp2-(full|grad-op|hybrid(\d+)))((?:-ac-reentrant|-ac|-sac|-compile)*)$"
)
_KNOBS_RE = re.compile(r"^(pre|post|none)-(lag|nolag)(-fwd)?(?:-u(\d+))?$")
_FSDP2_KNOBS_RE = re.compile(r"^pf(\d+)(?:-u(\d+))?$")
_STRATEGY_NAMES = ("single|ddp|fsdp-{full,grad-op,no-shard,hybrid<g>}|fsdp2-{full,grad-op,hybrid<g>}, "
                   "then optionally -ac (or -ac-reentrant, FSDP1 and single only, or -sac: selective), then optionally -compile (not with fsdp-*)")

# One line, as every SpecError. Why refuse rather than try: per-block compile is composed,
# in torchtitan and in PyTorch's own docs, with FSDP2 only; FSDP1 is deprecated upstream.
# Reentrant checkpointing is the FLAVA seed's AC (its train.py: CheckpointImpl.REENTRANT unless
# DDP). Where it is unsound, one line says why:
# * DDP: each checkpoint's nested backward marks the layer's parameters ready again, and DDP's
#   reducer raises "Expected to mark a variable ready only once" (the seed itself used
#   NO_REENTRANT under DDP for this reason).
# * FSDP2: fully_shard's hooks are registered on the module's forward and on autograd of the
#   unsharded DTensor parameters; torchtitan and the FSDP2 docs use only non-reentrant AC,
#   and the FLAVA double-pass problem it solved under FSDP1 does not exist under FSDP2
#   (units reshard between passes anyway; docs/strategies.md).
# * compile: dynamo does not trace through reentrant checkpoint's autograd.Function with
#   a nested backward; torch's own docs recommend use_reentrant=False with compile.
REENTRANT_REFUSALS: dict[str, str] = {
    "ddp": "reentrant checkpointing under DDP fails in the backward (\"Expected to mark a variable ready only once\"); "
           "use {plain!r}",
    "fsdp2": "reentrant checkpointing is offered with FSDP1 only (the FLAVA seed's form); FSDP2 composes with "
             "non-reentrant AC and reshards between FLAVA's passes without it; use {plain!r}",
    "compile": "torch.compile does not trace reentrant checkpointing's nested backward; use {plain!r}",
}
# Why FSDP1 cannot group: it has no list API. An FSDP1 unit is one module and everything under it
# that no nested unit claims, so k blocks in one unit need a module holding exactly those k; the
# families' stacks are ModuleLists of single blocks, and inserting a container renames every
# parameter below it (blocks.5.attn... -> blocks.2.1.attn...), the names freeze_unused, the codebook
# loading and the probe cache read. The one grouping with no new module, a whole stack
# (FSDP(ModuleList)), is not this axis. docs/strategies.md, "Units of k blocks".
FSDP1_UNIT_REFUSAL = ("knobs {knobs!r}: FSDP1 ({strategy!r}) cannot put {k} blocks in one unit: it has no list API, "
                      "and a container around them would rename their parameters (docs/strategies.md); "
                      "use {fsdp2!r} with 'pf0-u{k}'")
FSDP1_COMPILE_REFUSAL = ("strategy {name!r}: torch.compile is not offered with FSDP1 (fsdp-*), which is deprecated "
                         "upstream and which torchtitan never composes with per-block compile; use {fsdp2!r}")


@dataclass(frozen=True)
class Strategy:
    """How the model is distributed: wrapper, FSDP sharding, hybrid group size, AC, compile.

    ``wrapper`` is ``fsdp`` for FSDP1 (``FullyShardedDataParallel``) and ``fsdp2`` for
    ``fully_shard``. ``is_fsdp`` is true for both (the model is sharded by FSDP and takes
    FSDP knobs); ``is_fsdp1``/``is_fsdp2`` say which — the knobs, the unit proof, meta
    init and the grad scaler differ between the two.
    """

    wrapper: Literal["single", "ddp", "fsdp", "fsdp2"]
    sharding: str | None = None  # one of SHARDINGS (fsdp) or FSDP2_SHARDINGS (fsdp2)
    group: int | None = None  # hybrid sharding-group size (ranks that shard one replica)
    ac: bool = False
    compile: bool = False  # torch.compile each transformer block
    reentrant: bool = False  # with ac: CheckpointImpl.REENTRANT (the FLAVA seed's AC) instead of NO_REENTRANT
    selective: bool = False  # with ac: op-level selective checkpointing (-sac, rung/sac.py): matmul/SDPA outputs saved

    def __post_init__(self) -> None:
        if self.wrapper not in WRAPPERS:
            raise SpecError(f"unknown wrapper {self.wrapper!r}; expected one of {', '.join(WRAPPERS)}")
        if self.reentrant:
            if not self.ac:
                raise SpecError("reentrant is a form of activation checkpointing: it needs ac")
            why = ("compile" if self.compile else "ddp" if self.wrapper == "ddp"
                   else "fsdp2" if self.is_fsdp2 else None)
            if why is not None:
                plain = Strategy(self.wrapper, self.sharding, self.group, True, self.compile)
                raise SpecError(f"strategy {self._name()!r}: " + REENTRANT_REFUSALS[why].format(plain=str(plain)))
        if self.selective and (not self.ac or self.reentrant):
            raise SpecError("selective checkpointing (-sac) is a non-reentrant form of activation checkpointing: "
                            "it needs ac and not reentrant")
        if self.is_fsdp:
            allowed = SHARDINGS if self.is_fsdp1 else FSDP2_SHARDINGS
            if self.sharding not in allowed:
                raise SpecError(f"unknown {self.wrapper} sharding {self.sharding!r}; expected one of {', '.join(allowed)}")
            if (self.sharding == "hybrid") != (self.group is not None):
                raise SpecError("a hybrid group size is given exactly when sharding is 'hybrid'")
            if self.group is not None and self.group < 1:
                raise SpecError(f"hybrid group size must be >= 1, got {self.group}")
        elif self.sharding is not None or self.group is not None:
            raise SpecError(f"strategy {self.wrapper!r} takes no sharding")
        if self.compile and self.is_fsdp1:
            # The nearest compiled rung: the FSDP2 analogue, or DDP for NO_SHARD.
            near = (Strategy("ddp", None, None, self.ac, True, False, self.selective) if self.sharding == "no-shard"
                    else Strategy("fsdp2", self.sharding, self.group, self.ac, True, False, self.selective))
            raise SpecError(FSDP1_COMPILE_REFUSAL.format(name=self._name(), fsdp2=str(near)))

    def _name(self) -> str:
        if self.is_fsdp:
            prefix = "fsdp-" if self.is_fsdp1 else "fsdp2-"
            base = f"{prefix}hybrid{self.group}" if self.sharding == "hybrid" else f"{prefix}{self.sharding}"
        else:
            base = self.wrapper
        ac = ("-ac-reentrant" if self.reentrant else "-sac" if self.selective else "-ac") if self.ac else ""
        return base + ac + ("-compile" if self.compile else "")

    def __str__(self) -> str:
        return self._name()

    @property
    def is_fsdp(self) -> bool:
        """Sharded by FSDP, either generation."""
        return self.wrapper in ("fsdp", "fsdp2")

    @property
    def is_fsdp1(self) -> bool:
        return self.wrapper == "fsdp"

    @property
    def is_fsdp2(self) -> bool:
        return self.wrapper == "fsdp2"

    def check_world(self, world: int) -> None:
        """Raise SpecError when this strategy cannot run on ``world`` ranks."""
        if self.wrapper == "single" and world != 1:
            raise SpecError(f"strategy 'single' runs in one process, but the world size is {world}")
        if self.group is not None and world % self.group != 0:
            raise SpecError(f"hybrid group {self.group} does not divide the world size {world}")


def parse_strategy(name: str) -> Strategy:
    m = _STRATEGY_RE.match(name)
    if not m:
        if name.startswith("fsdp2-no-shard"):
            raise SpecError(f"unknown strategy {name!r}: FSDP2 has no NO_SHARD (fully_shard always shards); "
                            "use ddp, or fsdp2-hybrid1 to replicate over the world")
        raise SpecError(f"unknown strategy {name!r}; expected {_STRATEGY_NAMES}")
    head, sharding1, group1, sharding2, group2, tail = m.groups()
    modifiers = re.findall(r"-(ac-reentrant|ac|sac|compile)", tail)
    forms = [m for m in ("ac", "ac-reentrant", "sac") if m in modifiers]
    if len(forms) > 1:
        raise SpecError(f"strategy {name!r} names {' and '.join(repr('-' + m) for m in forms)}: one form of "
                        "activation checkpointing at most; pick one")
    for mod in ("ac", "ac-reentrant", "sac", "compile"):
        if modifiers.count(mod) > 1:
            raise SpecError(f"strategy {name!r} repeats '-{mod}'")
    reentrant, selective = "ac-reentrant" in modifiers, "sac" in modifiers
    ac, compiled = bool(forms), "compile" in modifiers
    if head in ("single", "ddp"):
        # arg-type: head is one of those two literals here, but mypy does not narrow a str by `in`
        strategy = Strategy(wrapper=head, ac=ac, compile=compiled, reentrant=reentrant,  # type: ignore[arg-type]
                            selective=selective)
    elif head.startswith("fsdp2-"):
        strategy = _fsdp_strategy("fsdp2", sharding2, group2, ac, compiled, reentrant, selective)
    else:
        strategy = _fsdp_strategy("fsdp", sharding1, group1, ac, compiled, reentrant, selective)
    _require_canonical("strategy", name, str(strategy))
    return strategy


def _fsdp_strategy(wrapper: Literal["fsdp", "fsdp2"], sharding: str, group: str | None, ac: bool, compiled: bool,
                   reentrant: bool, selective: bool = False) -> Strategy:
    if group is not None:
        return Strategy(wrapper, "hybrid", int(group), ac, compiled, reentrant, selective)
    return Strategy(wrapper, sharding, None, ac, compiled, reentrant, selective)


def _require_canonical(what: str, given: str, canonical: str) -> None:
    """One rung, one name: the name is a file path and an HDF5 key, so a second spelling
    (``fsdp-hybrid02``, ``n01``, ``b+8`` — ``int()`` accepts all of them) would be a
    second result for the same run, and a wildcard that never matches its own output."""
    if given != canonical and PRECISION_ALIASES.get(given) != canonical:
        raise SpecError(f"{what} {given!r} is not canonical; write {canonical!r}")


def _unit_suffix(unit_layers: int) -> str:
    """``-u<k>`` for a unit of k >= 2 blocks; nothing for 1, so that the seeds' paths stay as they were."""
    return f"-u{unit_layers}" if unit_layers != 1 else ""


def _check_unit_layers(knobs: str, unit_layers: int) -> None:
    if unit_layers < 1:
        raise SpecError(f"knobs {knobs!r}: a unit holds at least 1 block, got -u{unit_layers}")


@dataclass(frozen=True)
class Knobs:
    """FSDP1 communication knobs (ViT seed, Figure 1).

    ``unit_layers`` is parsed (``pre-lag-u2``) only so that an FSDP1 rung that asks for units of
    several blocks is refused by name (:data:`FSDP1_UNIT_REFUSAL`); every rung that runs has 1.
    """

    backward_prefetch: str = "pre"
    limit_all_gathers: bool = True
    forward_prefetch: bool = False
    unit_layers: int = 1

    def __post_init__(self) -> None:
        _check_unit_layers(str(self), self.unit_layers)

    def __str__(self) -> str:
        s = f"{self.backward_prefetch}-{'lag' if self.limit_all_gathers else 'nolag'}"
        return s + ("-fwd" if self.forward_prefetch else "") + _unit_suffix(self.unit_layers)


@dataclass(frozen=True)
class Fsdp2Knobs:
    """FSDP2's knobs: explicit prefetching, ``pf<n>``, and the unit size, ``-u<k>``.

    ``unit_layers`` = k: each FSDP unit holds k consecutive blocks of one stack,
    ``fully_shard([block_i, ..., block_{i+k-1}])`` (one set of hooks, one all-gather and one
    reduce-scatter for the k); the last unit of a stack holds the remainder when k does not
    divide it. k = 1, the seeds' unit per block, is the default and is not written in the path.
    ``prefetch_layers`` = n counts UNITS, not layers (the name is the record's, from when a unit
    was a layer): each unit all-gathers the next n units of its stack in forward
    (``set_modules_to_forward_prefetch``) and the previous n in backward
    (``set_modules_to_backward_prefetch``); at k = 1 a unit is a layer. ``pf0`` sets neither:
    FSDP2's implicit behaviour (forward: each unit gathers when it is called; backward: the unit
    before it in the recorded forward order is prefetched). FSDP1's backward_prefetch,
    limit_all_gathers and forward_prefetch do not exist in FSDP2.
    """

    prefetch_layers: int = 0
    unit_layers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.prefetch_layers <= MAX_FSDP2_PREFETCH:
            raise SpecError(f"FSDP2 knobs 'pf{self.prefetch_layers}': explicit prefetch of 0 to "
                            f"{MAX_FSDP2_PREFETCH} units, pf0..pf{MAX_FSDP2_PREFETCH}")
        _check_unit_layers(str(self), self.unit_layers)

    def __str__(self) -> str:
        return f"pf{self.prefetch_layers}" + _unit_suffix(self.unit_layers)


AnyKnobs = Knobs | Fsdp2Knobs


def parse_knobs(name: str) -> AnyKnobs:
    knobs: AnyKnobs
    m = _KNOBS_RE.match(name)
    if m:
        knobs = Knobs(m.group(1), m.group(2) == "lag", m.group(3) is not None, _unit_layers(name, m.group(4)))
    else:
        m = _FSDP2_KNOBS_RE.match(name)
        if not m:
            raise SpecError(f"unknown FSDP knobs {name!r}; expected FSDP1's <pre|post|none>-<lag|nolag>[-fwd] "
                            f"(e.g. pre-lag) or FSDP2's pf0|pf1|pf2, then optionally -u<k> (k blocks per unit, FSDP2)")
        knobs = Fsdp2Knobs(int(m.group(1)), _unit_layers(name, m.group(2)))
    _require_canonical("knobs", name, str(knobs))  # pf01, pf٢, pf0-u1, pf0-u02: int() reads them all
    return knobs


def _unit_layers(name: str, k: str | None) -> int:
    if k is None:
        return 1
    if int(k) < 1:
        raise SpecError(f"knobs {name!r}: a unit holds at least 1 block, got -u{k}")
    return int(k)


def check_unit_knobs(strategy: Strategy, knobs: AnyKnobs) -> None:
    """Refuse units of several blocks where there are none (a rung that is not FSDP) or where they
    cannot be built (FSDP1: :data:`FSDP1_UNIT_REFUSAL`), one line each. Whether k fits the model's
    stacks needs the model (:func:`check_unit_layers`)."""
    if not strategy.is_fsdp and knobs.unit_layers != 1:
        raise SpecError(f"knobs {str(knobs)!r}: -u{knobs.unit_layers} puts blocks in FSDP units, and {str(strategy)!r} "
                        f"is not FSDP (it has no units); write {DEFAULT_KNOBS!r}")
    if strategy.is_fsdp1 and knobs.unit_layers != 1:
        near = Strategy("fsdp2", "hybrid" if strategy.sharding == "hybrid" else
                        "full" if strategy.sharding == "no-shard" else strategy.sharding, strategy.group,
                        strategy.ac, False, False, strategy.selective)
        raise SpecError(FSDP1_UNIT_REFUSAL.format(knobs=str(knobs), strategy=str(strategy), k=knobs.unit_layers,
                                                  fsdp2=str(near)))


def check_unit_layers(model: str, knobs: AnyKnobs, stacks: list[int]) -> None:
    """Raise SpecError when a unit of ``knobs.unit_layers`` blocks is larger than one of the model's
    stacks (``stacks``: the blocks of each, ``Family.stacks``/``layer_counts``): the runner and the
    planner call it, the spec alone does not know the stacks."""
    k = knobs.unit_layers
    if k > 1 and stacks and k > min(stacks):
        raise SpecError(f"knobs {str(knobs)!r}: a unit of {k} blocks is larger than a stack of {model} "
                        f"(stacks of {', '.join(map(str, stacks))} blocks); -u{min(stacks)} at most")


def default_knobs(strategy: Strategy) -> AnyKnobs:
    """The knobs a rung of ``strategy`` gets when none are named: ``pf0`` for FSDP2,
    ``pre-lag`` for everything else (FSDP1's default; the only value non-FSDP rungs take)."""
    return parse_knobs(DEFAULT_FSDP2_KNOBS if strategy.is_fsdp2 else DEFAULT_KNOBS)


#: What users type for a precision -> the canonical name it stands for. ``bf16`` is what most
#: READMEs (and Lightning's "bf16") mean: bf16 autocast over fp32 weights, our ``bf16-mixed``.
#: Only the canonical name is ever written: run-spec paths, file names, records.
PRECISION_ALIASES: dict[str, str] = {"bf16": "bf16-mixed"}
#: Set once an alias has been said, so a process tree (snakemake -> jobs, launch -> ranks) says it once.
_ALIAS_SAID = "SCALELADDER_PRECISION_ALIAS_SAID"


def canonical_precision(name: str) -> str | None:
    """The canonical precision ``name`` stands for (an alias resolved), or None if it is none."""
    name = PRECISION_ALIASES.get(name, name)
    return name if name in PRECISIONS else None


def parse_precision(name: str) -> str:
    """The canonical precision; an alias (``bf16``) is accepted and said once on stderr."""
    canonical = canonical_precision(name)
    if canonical is None:
        aliases = ", ".join(f"{a} (= {c})" for a, c in PRECISION_ALIASES.items())
        raise SpecError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}, or {aliases}")
    if canonical != name and not os.environ.get(_ALIAS_SAID):
        # TRAP: the environment, not a module flag: the children (jobs, torchrun's ranks) inherit it
        os.environ[_ALIAS_SAID] = "1"
        print(f"scaleladder: precision {name!r} is read as {canonical!r} (bf16 autocast over fp32 weights; "
              f"'bf16-true' is bf16 weights); run-spec paths, file names and records say {canonical!r}", file=sys.stderr)
    return canonical


def parse_batch(value: str | int) -> int | Literal["max"]:
    if value == "max":
        return "max"
    try:
        return parse_positive("batch", value)
    except SpecError:
        raise SpecError(f"batch must be a positive integer or 'max', got {value!r}") from None


def parse_positive(what: str, value: str | int) -> int:
    return _parse_at_least(what, value, 1, "a positive integer")


def parse_nonnegative(what: str, value: str | int) -> int:
    return _parse_at_least(what, value, 0, "an integer >= 0")


def _parse_at_least(what: str, value: str | int, low: int, kind: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = low - 1
    if n < low:
        raise SpecError(f"{what} must be {kind}, got {value!r}")
    return n


def parse_steps_warmup(steps: str | int, warmup: str | int, prefix: str = "") -> tuple[int, int]:
    """Steps in all and warm-up steps, with ``0 <= warmup < steps``."""
    n = parse_positive(f"{prefix}steps", steps)
    w = parse_nonnegative(f"{prefix}warmup", warmup)
    if not w < n:
        raise SpecError(f"{prefix}warmup must be in [0, {prefix}steps), got {prefix}warmup={w} with {prefix}steps={n}")
    return n, w


@dataclass(frozen=True)
class RunSpec:
    """One rung. ``batch`` is the LOCAL (per-rank) batch."""

    model: str
    strategy: Strategy
    precision: str = "fp32"
    knobs: AnyKnobs = field(default_factory=Knobs)  # an FSDP2 rung must name Fsdp2Knobs (default_knobs)
    nodes: int = 1
    batch: int | Literal["max"] = 8

    def __post_init__(self) -> None:
        get_flavor(self.model)  # raises SpecError for an unknown model
        # an alias (bf16) becomes its canonical name here, so that .path and the records never hold it
        object.__setattr__(self, "precision", parse_precision(self.precision))
        parse_positive("nodes", self.nodes)
        parse_batch(self.batch)
        strategy, knobs = str(self.strategy), str(self.knobs)
        if self.strategy.is_fsdp2 and not isinstance(self.knobs, Fsdp2Knobs):
            raise SpecError(f"FSDP1 knobs {knobs!r} given for FSDP2 strategy {strategy!r}: fully_shard has no backward "
                            f"prefetch or limit_all_gathers; its knobs are explicit prefetch, pf0|pf1|pf2, and -u<k> blocks per unit")
        if self.strategy.is_fsdp1 and not isinstance(self.knobs, Knobs):
            raise SpecError(f"FSDP2 knobs {knobs!r} given for FSDP1 strategy {strategy!r}: FSDP1's knobs are "
                            f"<pre|post|none>-<lag|nolag>[-fwd], e.g. {DEFAULT_KNOBS}")
        check_unit_knobs(self.strategy, self.knobs)
        if not self.strategy.is_fsdp and knobs != DEFAULT_KNOBS:
            raise SpecError(f"FSDP knobs {knobs!r} given for non-FSDP strategy {strategy!r}")

    # -- the one canonical string form -------------------------------------------------
    @property
    def path(self) -> str:
        """``model/strategy/precision/knobs/n<nodes>/b<batch>``: the wildcard path and HDF5 group name."""
        return f"{self.model}/{self.strategy}/{self.precision}/{self.knobs}/n{self.nodes}/b{self.batch}"

    @classmethod
    def from_path(cls, path: str) -> RunSpec:
        parts = path.strip("/").removesuffix(".h5").split("/")
        if len(parts) < 6:
            raise SpecError(f"run-spec path {path!r} must end in model/strategy/precision/knobs/n<nodes>/b<batch>")
        model, strategy, precision, knobs, n, b = parts[-6:]
        if not (n.startswith("n") and b.startswith("b")):
            raise SpecError(f"run-spec path {path!r}: expected n<nodes>/b<batch> as its last two parts")
        spec = cls(
            model=model,
            strategy=parse_strategy(strategy),
            precision=parse_precision(precision),
            knobs=parse_knobs(knobs),
            nodes=parse_positive("nodes", n[1:]),
            batch=parse_batch(b[1:]),
        )
        for given, canonical in zip(parts[-6:], spec.path.split("/")):
            _require_canonical("run-spec part", given, canonical)
        return spec

    def as_attrs(self) -> dict[str, str | int | bool]:
        """Flat attributes for HDF5 (strings for the names, so they round-trip)."""
        return {
            "spec": self.path,
            "model": self.model,
            "strategy": str(self.strategy),
            "precision": self.precision,
            "knobs": str(self.knobs),
            "nodes": self.nodes,
            "batch": str(self.batch),
            "wrapper": self.strategy.wrapper,
            "sharding": self.strategy.sharding or "",
            "hybrid_group": self.strategy.group or 0,
            "activation_checkpointing": self.strategy.ac,
            "ac_reentrant": self.strategy.reentrant,
            "ac_selective": self.strategy.selective,
            "compile": self.strategy.compile,
            # knob_unit_layers only where k > 1: a unit per block (absent) keeps every earlier rung's record as it was
            **{f"knob_{k}": v for k, v in asdict(self.knobs).items() if k != "unit_layers" or v != 1},
        }
