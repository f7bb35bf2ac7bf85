"""The rung's one argument list: :class:`RunConfig`, each field declaring its ``scaleladder run`` flag.

Everything that starts or finishes a rung reads this list: ``run`` (the per-rank program,
rung/run.py), ``launch``/``finalize`` and ``maxbatch`` (which pass it on to the ranks and probes
with :meth:`RunConfig.argv`), ``converge``, and the workflow's rung rules, whose shared arguments
(:func:`rule_args`) are generated from the fields that name a rule placeholder. A field's
:func:`arg` metadata is its flag, help, default and parser; :func:`add_arguments` and
:func:`config_from_args` walk the fields, so a new setting of every rung is one field here (and,
for a site setting, one schema row naming its flag as ``run_arg``: site/commands.py passes it on).

TRAP: no torch here, nor anything that imports it: the supervisors (launch, finalize, maxbatch)
import this module in processes that only spawn the ranks, and importing torch there cost every
rung seconds (docs/performance.md, "Start-up"); tests/test_startup.py holds it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from scaleladder.flavors import Flavor, get_flavor
from scaleladder.models.flava_impl import DEFAULT as FLAVA_IMPL
from scaleladder.models.flava_impl import FLAVA_IMPLS, parse_flava_impl
from scaleladder.spec import (
    COMPILE_BACKENDS,
    RunSpec,
    SpecError,
    default_knobs,
    parse_batch,
    parse_knobs,
    parse_nonnegative,
    parse_positive,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)

__all__ = ["Arg", "arg", "RunConfig", "add_arguments", "config_from_args", "rule_args", "flag_defaults"]


@dataclass(frozen=True)
class Arg:
    """How a RunConfig field is given on the command line (the field's ``metadata["arg"]``)."""

    flag: str
    help: str
    default: str | None = None  # the argparse default (a string, as a user would type it), or None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], object] | None = None  # the string given -> the field's value (None: as given)
    switch: bool = False  # a flag without a value (store_true)
    always: bool = False  # argv() passes it even at its default (the rung's identity and its data)
    rule: str | None = None  # the ladder rules' placeholder for it (rule_args), e.g. "{params.steps}"


def arg(flag: str, help: str, default: str | None = None, choices: tuple[str, ...] | None = None,
        parse: Callable[[str], object] | None = None, switch: bool = False, always: bool = False,
        rule: str | None = None) -> dict[str, Arg]:
    """A field's metadata: ``field(default=..., metadata=arg("--x", "what it is"))``."""
    return {"arg": Arg(flag, help, default, choices, parse, switch, always, rule)}


def _arg(f: Field[object]) -> Arg | None:
    a = f.metadata.get("arg")
    return a if isinstance(a, Arg) else None


def _workers(value: str) -> int | str:
    return "auto" if str(value) == "auto" else parse_nonnegative("workers", value)


def _lr(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise SpecError(f"lr must be a number, got {value!r}") from None


def _seconds(what: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise SpecError(f"--{what} must be a number of seconds, got {value!r}") from None
        if not seconds >= 0:
            raise SpecError(f"--{what} must be >= 0, got {value!r}")
        return seconds

    return parse


@dataclass(frozen=True)
class RunConfig:
    """A rung plus how long to run it and where its data and result live.

    The fields in order are the positional constructor; each field's ``arg`` metadata is its
    ``run`` flag. ``spec`` is given as ``--spec`` or its parts (:func:`add_arguments`)."""

    spec: RunSpec = field(metadata=arg("--spec", "model/strategy/precision/knobs/n<nodes>/b<batch>, e.g. "
                                       "vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b32", always=True, rule="{params.spec:q}"))
    steps: int = field(metadata=arg("--steps", "steps in all, warm-up included (default 1000, the FLAVA seed's)",
                                    default="1000", always=True, rule="{params.steps}"))
    warmup: int = field(metadata=arg("--warmup", "first steps excluded from every figure (default 100)",
                                     default="100", always=True, rule="{params.warmup}"))
    data: str = field(metadata=arg("--data", "'synthetic' (batches made on the device), a shard manifest.json, or its directory",
                                   default="synthetic", always=True, rule="{params.data:q}"))
    workers: int | str = field(metadata=arg(
        "--workers", "data-loader workers per rank, or 'auto': from the rank's cores (sched_getaffinity, Slurm's binding) "
        "and the measured per-worker rate (data/cores.py); recorded", default="4", parse=_workers, always=True,
        rule="{params.workers}"))
    seed: int = field(metadata=arg("--seed", "integer >= 0: weights, synthetic batches, data order", default="0",
                                   parse=lambda v: parse_nonnegative("seed", v), always=True, rule="{params.seed}"))
    lr: float = field(metadata=arg("--lr", "AdamW learning rate", default="1e-4", parse=_lr, always=True))
    out: Path = field(metadata=arg("--out", "result .h5 (written atomically by rank 0)", parse=Path, always=True, rule="{output:q}"))
    device: str = field(metadata=arg("--device", "where the ranks train (auto: a GPU if torch sees one)", default="auto",
                                     choices=("auto", "cpu", "cuda"), always=True))
    codebook_weights: str | None = field(metadata=arg("--codebook-weights", "local DALL-E encoder weights for FLAVA (default: random init)"))
    peak_tflops: float | None = field(metadata=arg("--peak-tflops", "peak TFLOP/s of one rank's device, for a device not in the table",
                                                   parse=float))
    init: str = field(metadata=arg("--init", "build on the device, or on meta then materialise per FSDP unit", default="auto",
                                   choices=("auto", "device", "meta"), always=True))
    compile_backend: str = field(default="", metadata=arg(
        "--compile-backend", "torch.compile backend of a -compile rung (default inductor; aot_eager captures graphs without "
        "code generation)", choices=tuple(COMPILE_BACKENDS)))
    decode: str = field(default="cpu", metadata=arg(
        "--decode", "--data rungs: 'cpu' (JPEG decode + transforms in the workers) or 'gpu' (workers pass encoded JPEGs; "
        "nvJPEG decode and transforms on the device; refused without a GPU); a profile's loader.decode", default="cpu",
        choices=("cpu", "gpu")))
    trace_steps: int = field(default=0, metadata=arg(
        "--trace-steps", "torch.profiler trace of this many steps right after the warm-up, to <out>.trace.json (rank 0; "
        "a profile's profiling.trace_steps; 0: off)", default="0", parse=lambda v: parse_nonnegative("trace-steps", v)))
    memory_snapshot: bool = field(default=False, metadata=arg(
        "--memory-snapshot", "CUDA allocator memory history of the loop, to <out>.memory.pickle (rank 0; GPU only; a "
        "profile's profiling.memory_snapshot)", switch=True))
    flava_impl: str = field(default=FLAVA_IMPL, metadata=arg(
        "--flava-impl", "FLAVA rungs: 'sdpa' (fused attention, sync-free losses; the default) or 'torchmultimodal' (the "
        "package's own modules, for comparison); the same parameters and loss (docs/models.md)", default=FLAVA_IMPL,
        choices=tuple(FLAVA_IMPLS), parse=parse_flava_impl))
    transport: str = field(default="uint8", metadata=arg(
        "--transport", "--data rungs: the workers' images cross to the rank as uint8 and are normalised on the device "
        "(default), or float32, normalised in the workers (the reference); --decode gpu ships JPEGs; a profile's "
        "loader.transport", default="uint8", choices=("uint8", "float32")))
    progress_s: float = field(default=30.0, metadata=arg(
        "--progress-s", "seconds between rank 0's progress lines (0: none; a profile's profiling.progress_s)",
        default="30", parse=_seconds("progress-s")))
    models: str | None = field(default=None, metadata=arg(
        "--models", "a models file: YAML, a model name -> a timm, transformers or python entry, whose names --spec may "
        "use (docs/your-model.md; a profile's models_file)"))
    tensorboard: str | None = field(default=None, metadata=arg(
        "--tensorboard", "a folder for this rung's per-step TensorBoard scalars, DIR/<spec>/: loss, step time, items/s, "
        "memory, written by rank 0 from its record after the timed window (a profile's trackers.tensorboard; needs "
        "the tensorboard extra)"))
    shortened_from: int | None = field(default=None, metadata=arg(
        "--shortened-from", "the steps the ladder configured, where the site's time limit shortened this rung to --steps "
        "(the workflow passes it; recorded as steps_configured)", parse=lambda v: parse_nonnegative("shortened-from", v)))
    # The spec's flavor, resolved once here (RunSpec has checked the name): not an argument,
    # so argv and the constructor are unchanged, and dataclasses.replace resolves it again.
    flavor: Flavor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flavor", get_flavor(self.spec.model))  # frozen: set once, here

    def argv(self, **override: Any) -> list[str]:
        """The ``run`` arguments that reproduce this config (launch, maxbatch and converge pass them on).

        ``override`` replaces fields (maxbatch's probes: ``spec``, ``out``, ``steps``, ``warmup``). A
        shorter run traces what it has: ``trace_steps`` is capped at the overridden window."""
        values = {f.name: override.get(f.name, getattr(self, f.name)) for f in fields(self) if _arg(f)}
        if "steps" in override or "warmup" in override:
            values["trace_steps"] = min(values["trace_steps"], max(0, values["steps"] - values["warmup"]))
        args: list[str] = []
        for f in fields(self):
            a = _arg(f)
            if a is None:
                continue
            value = values[f.name]
            if a.switch:
                args += [a.flag] if value else []
            elif value is not None and (a.always or value != f.default):
                args += [a.flag, _text(value)]
        return args

    def attrs(self) -> dict[str, Any]:
        """The spec and these settings as record attributes (results/record.py: Spec, Settings)."""
        from scaleladder.models.families import family_of
        from scaleladder.models.flava_impl import recorded
        from scaleladder.results.record import Settings as S

        return {**self.spec.as_attrs(), S.steps: self.steps, S.warmup: self.warmup, S.data: self.data, S.seed: self.seed,
                S.lr: self.lr, S.compile_backend: self.compile_backend,
                S.flava_impl: recorded(family_of(self.flavor), self.flava_impl),
                **({S.model_entry: self.flavor.entry} if self.flavor.entry else {}),
                **({S.steps_configured: self.shortened_from} if self.shortened_from else {})}


def _text(value: object) -> str:
    """A field's value as ``run`` reads it back: floats by repr (no digits lost), the spec by its path."""
    if isinstance(value, RunSpec):
        return value.path
    if isinstance(value, float):
        return repr(value)
    return str(value)


def add_arguments(p: argparse.ArgumentParser, config: type[RunConfig] = RunConfig) -> None:
    """Every field's flag on ``p`` (``--spec`` beside the spec's parts, in a group of their own)."""
    g = p.add_argument_group("the rung (either --spec, or the parts)")
    for f in fields(config):
        a = _arg(f)
        if a is None:
            continue
        target = g if f.name == "spec" else p
        if a.switch:
            target.add_argument(a.flag, action="store_true", help=a.help)
        else:
            target.add_argument(a.flag, default=a.default, choices=list(a.choices) if a.choices else None, help=a.help,
                                required=f.name == "out")
        if f.name == "spec":
            g.add_argument("--model")
            g.add_argument("--strategy", default=None,
                           help="single|ddp|fsdp-{full,grad-op,no-shard,hybrid<g>}|fsdp2-{full,grad-op,hybrid<g>}, then [-ac], "
                                "then [-compile] (not fsdp-*)")
            g.add_argument("--precision", default=None, help="fp32|tf32|bf16-mixed|fp16-mixed|bf16-true (default fp32; bf16 is "
                                                             "read as bf16-mixed)")
            g.add_argument("--knobs", default=None,
                           help="FSDP1: <pre|post|none>-<lag|nolag>[-fwd] (default pre-lag); FSDP2: pf0|pf1|pf2 (default pf0), "
                                "then optionally -u<k>: k consecutive blocks per FSDP unit (pf0-u4)")
            g.add_argument("--nodes", default=None, help="nodes the run spans (default 1; checked against the launcher)")
            g.add_argument("--batch", default=None, help="local (per-rank) batch")


def _spec(a: argparse.Namespace) -> RunSpec:
    parts = (a.model, a.strategy, a.precision, a.knobs, a.nodes, a.batch)
    if a.spec:
        if any(x is not None for x in parts):
            raise SpecError("give either --spec or --model/--strategy/..., not both")
        return RunSpec.from_path(a.spec)
    if a.model is None or a.strategy is None or a.batch is None:
        raise SpecError("--model, --strategy and --batch are required without --spec")
    strategy = parse_strategy(a.strategy)
    return RunSpec(a.model, strategy, parse_precision(a.precision or "fp32"),
                   parse_knobs(a.knobs) if a.knobs else default_knobs(strategy),
                   parse_positive("nodes", a.nodes or 1), parse_batch(a.batch))


def config_from_args(a: argparse.Namespace, config: type[RunConfig] = RunConfig) -> RunConfig:
    """The one place where ``run``-style arguments become a RunConfig: each field by its parser,
    then what only the whole rung can check (one line naming the culprit, exit 2)."""
    values: dict[str, Any] = {}
    for f in fields(config):
        a_ = _arg(f)
        if a_ is None or f.name in ("spec", "steps", "warmup"):
            continue
        raw = getattr(a, f.name, a_.default)
        values[f.name] = a_.parse(raw) if (a_.parse and raw is not None) else raw
    if values["models"]:  # before the spec: its model may be one of the file's names
        from scaleladder.models.models_file import register_models_file  # torch-free

        register_models_file(values["models"])
    spec = _spec(a)
    steps, warmup = parse_steps_warmup(a.steps, a.warmup)
    if spec.strategy.compile and warmup < 1:
        raise SpecError(f"{spec.strategy} needs --warmup >= 1: its first step compiles, and compile time must stay out of the measured window")
    if values["compile_backend"] and not spec.strategy.compile:
        raise SpecError(f"--compile-backend applies to -compile strategies only, not {str(spec.strategy)!r}")
    values["compile_backend"] = (values["compile_backend"] or "inductor") if spec.strategy.compile else ""
    if values["data"] != "synthetic":
        from scaleladder.data.manifest import MANIFEST_FILE, resolve  # the loader's own rule: file, or the directory holding it

        if not resolve(values["data"]).is_file():
            why = (f"a directory with no {MANIFEST_FILE}" if Path(values["data"]).is_dir()
                   else "no such manifest file or shard directory (or use 'synthetic')")
            raise SpecError(f"--data {values['data']!r}: {why}")
    weights = values["codebook_weights"]
    if weights and not Path(weights).is_file():
        raise SpecError(f"--codebook-weights {weights!r}: no such file")
    from scaleladder.models.families import family_of  # torch-free

    if weights and not family_of(get_flavor(spec.model)).codebook_prefix:  # a family with a codebook: FLAVA's
        raise SpecError(f"--codebook-weights applies to FLAVA flavors only, not {spec.model}")
    if values["peak_tflops"] is not None and not values["peak_tflops"] > 0:
        raise SpecError(f"--peak-tflops must be > 0, got {values['peak_tflops']}")
    if values["out"].suffix != ".h5":
        raise SpecError(f"--out {str(values['out'])!r} must end in .h5")
    from scaleladder.rung.profiling import check_profiling  # torch-free

    check_profiling(values["trace_steps"], values["memory_snapshot"], steps, warmup, "cpu" if values["device"] == "cpu" else None)
    return config(spec, steps, warmup, **values)


def rule_args(config: type[RunConfig] = RunConfig) -> str:
    """The rung's own arguments in the ladder rules' shell commands (site/commands.rung_shell): every
    field that names a rule placeholder, in field order. TRAP: the rules' shell template is what
    Snakemake's code trigger compares, so this string must stay byte for byte what the rules ran
    (tests/test_settings.py holds it): a new field must not add a placeholder here, but travel in
    the rules' options parameter (site/commands.rung_options)."""
    return " ".join(f"{a.flag} {a.rule}" for f in fields(config) if (a := _arg(f)) is not None and a.rule)


def flag_defaults(config: type[RunConfig] = RunConfig) -> dict[str, object]:
    """Each flag's default as the rung reads it (the field's default, or its parsed argparse default)."""
    out: dict[str, object] = {}
    for f in fields(config):
        a = _arg(f)
        if a is None:
            continue
        if a.switch:
            out[a.flag] = False
        elif a.default is not None:
            out[a.flag] = a.parse(a.default) if a.parse else a.default
        else:
            out[a.flag] = None
    return out
