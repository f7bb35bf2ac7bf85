"""The run spec: the one value that flows through scaleladder.

A rung of the ladder is fully described by a :class:`RunSpec`. It is written once
as a path (``vit-base/fsdp-hybrid2-ac/bf16-mixed/pre-lag/n1/b32``), which is also
the Snakemake wildcard path, parsed once here, and stored as HDF5 attributes.
Nothing else in the code base re-derives it: everything else calls
:func:`parse_strategy`, :func:`parse_knobs` or :meth:`RunSpec.from_path`.

Grammar (each part round-trips through ``str()``/``parse_*``; a part that parses but
is not written canonically, e.g. ``fsdp-hybrid02``, ``n01``, ``b+8``, is an error):

* strategy  ``single | ddp | fsdp-full | fsdp-grad-op | fsdp-no-shard | fsdp-hybrid<g>``
  optionally followed by ``-ac`` (non-reentrant activation checkpointing).
  ``single`` is a plain, unwrapped model in one process: the reference every
  other strategy's loss curve must reproduce.
* precision ``fp32 | tf32 | bf16-mixed | fp16-mixed | bf16-true``
* knobs     ``<prefetch>-<lag|nolag>[-fwd]`` with prefetch ``pre|post|none``:
  FSDP backward prefetch, ``limit_all_gathers`` on/off, forward prefetch on.
  Non-FSDP strategies only accept the default ``pre-lag`` (the knobs do not exist
  there, and a second name for the same run would duplicate results).
* batch     a positive local (per-rank) batch, or ``max`` for the max-batch search.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Literal

# SpecError is re-exported: `from scaleladder.spec import SpecError` is the usual import.
from scaleladder.errors import SpecError as SpecError
from scaleladder.models.flavors import get_flavor

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true")
SHARDINGS: tuple[str, ...] = ("full", "grad-op", "no-shard", "hybrid")
PREFETCHES: tuple[str, ...] = ("pre", "post", "none")
DEFAULT_KNOBS = "pre-lag"


_STRATEGY_RE = re.compile(r"^(single|ddp|fsdp-(full|grad-op|no-shard|hybrid(\d+)))(-ac)?$")
_KNOBS_RE = re.compile(r"^(pre|post|none)-(lag|nolag)(-fwd)?$")


@dataclass(frozen=True)
class Strategy:
    """How the model is distributed: wrapper, FSDP sharding, hybrid group size, AC."""

    wrapper: Literal["single", "ddp", "fsdp"]
    sharding: str | None = None  # one of SHARDINGS when wrapper == "fsdp"
    group: int | None = None  # hybrid sharding-group size (ranks that shard one replica)
    ac: bool = False

    def __post_init__(self) -> None:
        if self.wrapper == "fsdp":
            if self.sharding not in SHARDINGS:
                raise SpecError(f"unknown FSDP sharding {self.sharding!r}; expected one of {', '.join(SHARDINGS)}")
            if (self.sharding == "hybrid") != (self.group is not None):
                raise SpecError("a hybrid group size is given exactly when sharding is 'hybrid'")
            if self.group is not None and self.group < 1:
                raise SpecError(f"hybrid group size must be >= 1, got {self.group}")
        elif self.sharding is not None or self.group is not None:
            raise SpecError(f"strategy {self.wrapper!r} takes no sharding")

    def __str__(self) -> str:
        if self.wrapper == "fsdp":
            base = f"fsdp-hybrid{self.group}" if self.sharding == "hybrid" else f"fsdp-{self.sharding}"
        else:
            base = self.wrapper
        return base + ("-ac" if self.ac else "")

    @property
    def is_fsdp(self) -> bool:
        return self.wrapper == "fsdp"

    def check_world(self, world: int) -> None:
        """Raise SpecError when this strategy cannot run on ``world`` ranks."""
        if self.wrapper == "single" and world != 1:
            raise SpecError(f"strategy 'single' runs in one process, but the world size is {world}")
        if self.group is not None and world % self.group != 0:
            raise SpecError(f"hybrid group {self.group} does not divide the world size {world}")


def parse_strategy(name: str) -> Strategy:
    m = _STRATEGY_RE.match(name)
    if not m:
        raise SpecError(
            f"unknown strategy {name!r}; expected single|ddp|fsdp-full|fsdp-grad-op|fsdp-no-shard|fsdp-hybrid<g>, optionally with -ac"
        )
    head, sharding, group, ac = m.groups()
    if head in ("single", "ddp"):
        strategy = Strategy(wrapper=head, ac=bool(ac))  # type: ignore[arg-type]
    elif group is not None:
        strategy = Strategy("fsdp", "hybrid", int(group), bool(ac))
    else:
        strategy = Strategy("fsdp", sharding, None, bool(ac))
    _require_canonical("strategy", name, str(strategy))
    return strategy


def _require_canonical(what: str, given: str, canonical: str) -> None:
    """One rung, one name: the name is a file path and an HDF5 key, so a second spelling
    (``fsdp-hybrid02``, ``n01``, ``b+8`` — ``int()`` accepts all of them) would be a
    second result for the same run, and a wildcard that never matches its own output."""
    if given != canonical:
        raise SpecError(f"{what} {given!r} is not canonical; write {canonical!r}")


@dataclass(frozen=True)
class Knobs:
    """FSDP communication knobs (ViT seed, Figure 1)."""

    backward_prefetch: str = "pre"
    limit_all_gathers: bool = True
    forward_prefetch: bool = False

    def __str__(self) -> str:
        s = f"{self.backward_prefetch}-{'lag' if self.limit_all_gathers else 'nolag'}"
        return s + ("-fwd" if self.forward_prefetch else "")


def parse_knobs(name: str) -> Knobs:
    m = _KNOBS_RE.match(name)
    if not m:
        raise SpecError(f"unknown FSDP knobs {name!r}; expected <pre|post|none>-<lag|nolag>[-fwd], e.g. pre-lag")
    return Knobs(m.group(1), m.group(2) == "lag", m.group(3) is not None)


def parse_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise SpecError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return name


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
    knobs: Knobs = field(default_factory=Knobs)
    nodes: int = 1
    batch: int | Literal["max"] = 8

    def __post_init__(self) -> None:
        get_flavor(self.model)  # raises SpecError for an unknown model
        parse_precision(self.precision)
        parse_positive("nodes", self.nodes)
        parse_batch(self.batch)
        if not self.strategy.is_fsdp and str(self.knobs) != DEFAULT_KNOBS:
            raise SpecError(f"FSDP knobs {str(self.knobs)!r} given for non-FSDP strategy {str(self.strategy)!r}")

    # -- the one canonical string form -------------------------------------------------
    @property
    def path(self) -> str:
        """``model/strategy/precision/knobs/n<nodes>/b<batch>``: the wildcard path and HDF5 group name."""
        return f"{self.model}/{self.strategy}/{self.precision}/{self.knobs}/n{self.nodes}/b{self.batch}"

    @classmethod
    def from_path(cls, path: str) -> "RunSpec":
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
            "sharding": self.strategy.sharding or "",
            "hybrid_group": self.strategy.group or 0,
            "activation_checkpointing": self.strategy.ac,
            **{f"knob_{k}": v for k, v in asdict(self.knobs).items()},
        }
