"""The spec: what a rung is, by name, checked before anything heavy is imported.

- ``run_spec``: the run spec, the one value that flows through scaleladder: its grammar, parsed once.
- ``flavors``: the model registry: every model scaleladder knows, by name, in a table code may extend.

The lowest floor above the base: torch-free, it imports only ``scaleladder.errors``. The run
spec's names are re-exported here (``from scaleladder.spec import RunSpec``, ``SpecError``
too); the registry is imported from its module (``from scaleladder.spec.flavors import get_flavor``).
"""

from scaleladder.errors import SpecError
from scaleladder.spec.run_spec import (
    COMPILE_BACKENDS,
    DEFAULT_FSDP2_KNOBS,
    DEFAULT_KNOBS,
    FSDP1_COMPILE_REFUSAL,
    FSDP2_SHARDINGS,
    MAX_FSDP2_PREFETCH,
    PRECISION_ALIASES,
    PRECISIONS,
    PREFETCHES,
    REENTRANT_REFUSALS,
    SHARDINGS,
    WRAPPERS,
    AnyKnobs,
    Fsdp2Knobs,
    Knobs,
    RunSpec,
    Strategy,
    canonical_precision,
    default_knobs,
    parse_batch,
    parse_knobs,
    parse_nonnegative,
    parse_positive,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)

__all__ = [
    "COMPILE_BACKENDS", "DEFAULT_FSDP2_KNOBS", "DEFAULT_KNOBS", "FSDP1_COMPILE_REFUSAL", "FSDP2_SHARDINGS",
    "MAX_FSDP2_PREFETCH", "PRECISIONS", "PRECISION_ALIASES", "PREFETCHES", "REENTRANT_REFUSALS", "SHARDINGS",
    "WRAPPERS", "AnyKnobs", "Fsdp2Knobs", "Knobs", "RunSpec", "SpecError", "Strategy", "canonical_precision",
    "default_knobs", "parse_batch", "parse_knobs", "parse_nonnegative", "parse_positive", "parse_precision",
    "parse_steps_warmup", "parse_strategy",
]
