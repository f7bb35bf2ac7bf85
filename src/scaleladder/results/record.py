"""The one definition of what a rung's record holds: every attribute, its unit and meaning.

Each attribute is named once, in a :class:`Section` (a topic: the spec, the throughput,
the memory, ...), as an :class:`Attr`: a ``str`` that IS the HDF5 attribute's name (so it
works as a dict key and ``f.attrs`` key) and carries ``unit`` and ``doc``. A :class:`Kind`
(ok, oom, predicted-oom, corrupt, convergence, ...) is the set of sections a record of that
kind may hold. Writers pass their attributes through :func:`checked` (store.write_record
does), so a name not defined here fails the writer's tests, never reaches a file; readers
index records by these names (``r.get(Throughput.items_per_s)``), not by string literals.

Adding a field: one line in its section here, plus the code that measures it. The table in
docs/design.md ("Result file") is generated from this module
(``python -m scaleladder.results.record --markdown``; tests/test_record.py keeps them equal).

Older records: every reader reads with ``.get``, so an attribute a record predates is absent
(NaN in figures, "-" in the report), as before; files carry no version attribute of their own
(adding one would change every record), the ladder file's ``format`` names its version.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from scaleladder import markdown as md
from scaleladder.log import get_logger


class Attr(str):
    """An attribute's name (a plain ``str`` for dicts and HDF5) with its unit and meaning."""

    unit: str
    doc: str
    section: str

    def __new__(cls, name: str, unit: str = "", doc: str = "", section: str = "") -> Attr:
        a = super().__new__(cls, name)
        a.unit, a.doc, a.section = unit, doc, section
        return a


@dataclass(frozen=True)
class _Pending:
    unit: str
    doc: str


def attr(unit: str, doc: str) -> Attr:
    """A field of a :class:`Section`; its name is the class attribute's (set by the section)."""
    return _Pending(unit, doc)  # type: ignore[return-value]  # becomes an Attr in Section.__init_subclass__


class Section:
    """A group of attributes on one topic. Subclasses declare ``name = attr(unit, doc)``."""

    title: ClassVar[str] = ""
    stored: ClassVar[bool] = True  # False: added by a reader (read_ladder), never in a file
    fields: ClassVar[tuple[Attr, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        made = []
        for name, value in list(vars(cls).items()):
            if isinstance(value, _Pending):
                a = Attr(name, value.unit, value.doc, cls.__name__)
                setattr(cls, name, a)
                made.append(a)
        cls.fields = tuple(made)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(str(a) for a in cls.fields)


# -- sections ---------------------------------------------------------------------------------


class Record(Section):
    title = "Every record"
    status = attr("", "`ok`, `oom` (ran out of memory: a result), `predicted-oom` (the planner said it cannot fit; "
                      "never ran), `corrupt` (ladder file only: the rung's file was unreadable), `did-not-converge` "
                      "(convergence records)")


class Spec(Section):
    title = "The run spec (spec.RunSpec.as_attrs)"
    spec = attr("", "the canonical spec path, model/strategy/precision/knobs/n<nodes>/b<batch>")
    model = attr("", "the flavor (flavors.py, the model registry)")
    strategy = attr("", "single | ddp | fsdp-* | fsdp2-*, then -ac, -ac-reentrant or -sac, then -compile")
    precision = attr("", "fp32 | tf32 | bf16-mixed | fp16-mixed | bf16-true")
    knobs = attr("", "FSDP1 `<pre|post|none>-<lag|nolag>[-fwd]` or FSDP2 `pf<n>[-u<k>]`")
    nodes = attr("count", "nodes the run spans")
    batch = attr("", "local (per-rank) batch; a max-batch record: the batch it settled on")
    wrapper = attr("", "single | ddp | fsdp | fsdp2")
    sharding = attr("", "the spec's FSDP sharding (\"\" without FSDP)")
    hybrid_group = attr("count", "hybrid sharding-group size (0: not hybrid)")
    activation_checkpointing = attr("bool", "the spec asks for activation checkpointing (-ac, -ac-reentrant, -sac)")
    ac_reentrant = attr("bool", "reentrant checkpointing")
    ac_selective = attr("bool", "selective (op-level) checkpointing, -sac: matmul and attention outputs saved")
    compile = attr("bool", "the spec asks for torch.compile (-compile)")
    knob_backward_prefetch = attr("", "FSDP1 knob: pre | post | none")
    knob_limit_all_gathers = attr("bool", "FSDP1 knob: limit_all_gathers")
    knob_forward_prefetch = attr("bool", "FSDP1 knob: forward_prefetch")
    knob_prefetch_layers = attr("count", "FSDP2 knob: units prefetched explicitly (pf<n>; a unit is a layer unless -u<k>)")
    knob_unit_layers = attr("count", "FSDP2 knob: consecutive layers of a stack per FSDP unit (-u<k>; the last unit of a "
                                     "stack holds the remainder); absent: 1, a unit per layer")


class Settings(Section):
    title = "How the rung was run (rung.run_config.RunConfig.attrs)"
    steps = attr("count", "steps in all, warm-up included (a convergence record: its step budget)")
    warmup = attr("count", "first steps excluded from every statistic")
    steps_configured = attr("count", "the steps the ladder configured, where the site's time limit shortened this rung to "
                                     "`steps` (campaign/timelimit.py); absent where it ran them all")
    data = attr("", "`synthetic`, or the shard manifest the loader read")
    seed = attr("", "weights, synthetic batches and data order")
    lr = attr("", "AdamW learning rate")
    compile_backend = attr("", "torch.compile backend of a -compile rung (\"\" otherwise)")
    flava_impl = attr("", "FLAVA's implementation: `sdpa` (fused attention, sync-free losses) | `torchmultimodal` "
                          "(the package's own); \"\" on ViT rungs (docs/models.md)")
    model_entry = attr("", "a models-file model's entry as JSON: its source, name or config, task and keyword arguments "
                           "(docs/your-model.md); readers register the model from it, so no models file is needed to "
                           "read the record; absent for a built-in flavor")


class Build(Section):
    title = "What was built (rung.parallelize)"
    world_size = attr("count", "ranks")
    params = attr("count", "model parameters (an oom record: counted on the meta device)")
    frozen_unused_params = attr("count", "parameters no loss reaches, frozen before wrapping")
    fsdp_units = attr("count", "FSDP units wrapped")
    fsdp_layer_units = attr("count", "of them, the units that hold transformer layers (one each; k each under -u<k>)")
    ac_layers = attr("count", "layers under activation checkpointing")
    compiled_layers = attr("count", "blocks compiled (-compile rungs)")
    sharding_ran = attr("", "what the wrapper did, read from the wrapped model (docs/metrics.md)")
    param_shard_fraction = attr("fraction", "parameter elements this rank holds / the model's")
    init = attr("", "`device` (built on the device) or `meta` (materialised per FSDP unit)")


class Placement(Section):
    title = "Where it ran (rung.run.placement, rung.provenance.rank_placement)"
    device_name = attr("", "the device rank 0 ran on")
    hosts = attr("JSON list", "every rank's host, in rank order, deduplicated")
    ranks_per_node = attr("count", "ranks per node")
    gpus_per_node = attr("count", "GPUs (GCDs) per node, one rank each; 0 on the CPU")
    launcher = attr("", "what started the ranks: torchrun, srun or none")
    rank_placement = attr("JSON list", "one {rank, host, addr, node, local_rank} per rank, in rank order")
    master_host = attr("", "the rendezvous host as the launcher named it")
    master_addr = attr("", "what it resolved to")
    master_port = attr("", "the rendezvous port")


class Provenance(Section):
    title = "Provenance (rung.provenance.collect)"
    torch_version = attr("", "torch.__version__")
    cuda_version = attr("", "torch.version.cuda (\"\" on ROCm and CPU builds)")
    hip_version = attr("", "torch.version.hip (\"\" elsewhere)")
    python_version = attr("", "the interpreter's version")
    git_commit = attr("", "the scaleladder checkout's commit (`-dirty` with local edits)")
    slurm_job_id = attr("", "$SLURM_JOB_ID (\"\" outside Slurm)")
    container_image = attr("", "the Apptainer/Singularity image, or $SCALELADDER_IMAGE")
    created_utc = attr("ISO 8601", "when the record was written")
    command = attr("", "the command line of the writing process")


class Peak(Section):
    title = "The peak MFU is taken against (rung.device_peak.peak_info)"
    peak_tflops_per_device = attr("TFLOP/s", "dense peak of one rank's device for the precision (NaN: unknown)")
    device_sm_count = attr("count", "multiprocessors (CUs on ROCm) the device reports; 0 on the CPU")
    device_power_limit_w = attr("W", "enforced power limit (NaN: not read)")
    peak_note = attr("", "why MFU is NaN, or what was not checked (\"\" when the peak applies in full)")


class Throughput(Section):
    title = "Throughput over the measured window (docs/metrics.md)"
    flops_per_sample = attr("FLOP", "analytic model FLOPs of one trained sample")
    hardware_flops_per_sample = attr("FLOP", "the above plus recomputed (checkpointed) forwards")
    samples_per_s = attr("samples/s", "global_batch x measured steps / window_s")
    items_per_s = attr("items/s", "samples/s x items per sample (FLAVA: image + text = 2)")
    items_per_sample = attr("count", "1 (ViT) or 2 (FLAVA)")
    window_s = attr("s", "the measured steps, barrier to final sync, max over ranks")
    step_time_mean_s = attr("s", "mean of step_time_s after warm-up")
    step_time_median_s = attr("s", "median of step_time_s after warm-up")
    step_time_p90_s = attr("s", "90th percentile of step_time_s after warm-up")
    tflops_per_device = attr("TFLOP/s", "flops_per_sample x samples_per_s / world / 1e12")
    mfu = attr("fraction", "achieved model FLOP/s per device / peak (NaN where no peak applies)")
    hfu = attr("fraction", "the same with hardware FLOPs")
    final_loss = attr("", "the last step's loss (mean over ranks)")


class Interval(Section):
    title = "How sure the throughput is (results/stats.py within_run; docs/metrics.md, 'Uncertainty')"
    items_per_s_median = attr("items/s", "throughput at the median step")
    items_per_s_ci_low = attr("items/s", "lower end of the 95% interval (NaN: none)")
    items_per_s_ci_high = attr("items/s", "upper end of the 95% interval (NaN: none; inf: unbounded)")
    items_per_s_se = attr("items/s", "the standard error the interval was built from")
    ci_dof = attr("count", "its t degrees of freedom (0: no interval)")
    ci_method = attr("", "how the interval was made (`batch means: ...` or `between runs: ...`)")
    ci_note = attr("", "why there is no interval (\"\" when there is)")
    ci_level = attr("fraction", "0.95")
    ci_steps = attr("count", "measured steps the interval rests on")


class Memory(Section):
    title = "Memory over the measured window (docs/metrics.md)"
    peak_active_gib = attr("GiB", "allocator active peak, max over ranks")
    peak_reserved_gib = attr("GiB", "allocator reserved peak, max over ranks")
    peak_device_used_gib = attr("GiB", "what the device had in use at the window's peak, max over ranks")
    device_total_gib = attr("GiB", "the device's memory")
    alloc_retries = attr("count", "allocator retries inside the window, summed over ranks")
    ooms = attr("count", "allocator OOMs inside the window, summed over ranks")


class Host(Section):
    title = "Host-boundness (GPU rungs only; absent on the CPU: rung/loop.py, docs/metrics.md 'Host-boundness')"
    host_issue_median_s = attr("s", "rank 0's host time to issue a step (its start -> its last call returned, no sync), "
                                    "median over the measured steps")
    host_boundness = attr("fraction", "host_issue_median_s / the median event-timed step (rank 0)")
    device_lag_median_s = attr("s", "how far the device was behind the host where the host began a step, median "
                                    "(0: the device had waited for the host)")
    host_bound = attr("bool", "host_boundness >= 0.9 and device_lag_median_s under a tenth of a step")


class Compile(Section):
    title = "torch.compile (-compile rungs only; absent on eager ones)"
    compile_s = attr("s", "the warm-up's cost beyond steady state")
    compile_graphs = attr("count", "graphs Dynamo captured in the warm-up")


class Startup(Section):
    title = "Start-up phases, rank 0 (rung/startup.py; docs/metrics.md, 'Start-up')"
    startup_imports_s = attr("s", "process start -> torch and the family's modules imported")
    startup_group_s = attr("s", "-> the process group is ready")
    startup_build_s = attr("s", "-> data source opened, model built and wrapped, optimizer made")
    startup_first_batch_s = attr("s", "-> the first batch in hand")
    startup_s = attr("s", "their sum: the seconds before the first step")
    teardown_s = attr("s", "the last step -> the record's attributes assembled")
    startup_origin = attr("", "`process start (/proc)` or `scaleladder import`")


class Loader(Section):
    title = "The input pipeline (--data rungs only: data/loader.py, rung/feed.py, data/devdecode.py)"
    decode_path = attr("", "`cpu`, `gpu (...)` or `host fallback (...)`")
    loader_workers = attr("count", "DataLoader workers per rank")
    tokenizer_vocab_size = attr("count", "FLAVA: the tokenizer's vocabulary (the model keeps its published one)")
    loader_wait_fraction = attr("fraction", "timed steps' loader wait / their step time")
    input_bound = attr("bool", "loader_wait_fraction above 3%")
    loader_samples_per_s = attr("samples/s", "the loader's own rate, per rank")
    decode_images = attr("count", "--decode gpu: images the device decoder was given")
    decode_cpu_fallbacks = attr("count", "of them, decoded on the host")
    decode_cpu_fallback_fraction = attr("fraction", "decode_cpu_fallbacks / decode_images")
    loader_transport = attr("", "what crosses from the workers to the rank: `uint8`, `jpeg` (--decode gpu) or `float32`")
    loader_cpu_s_per_batch = attr("s", "the loader's host cost: the workers' CPU seconds per batch, timed steps' mean")
    loader_workers_auto = attr("", "--workers auto: what the count was chosen from (cores per rank, per-worker rate)")
    loader_worker_cores = attr("count", "cores the workers were bound to, the rank's own kept free (0: unbound)")
    label_source = attr("", "`synthetic`: the shards had no labels and the image model trained on labels drawn from each "
                            "sample's key (its throughput holds, its accuracy means nothing); absent: the shards' own labels")


class Profiling(Section):
    title = "Profiling files written next to the record (only when asked for: rung/profiling.py)"
    trace_file = attr("", "the torch.profiler Chrome trace, relative to the record's folder")
    trace_steps = attr("count", "steps traced")
    trace_first_step = attr("step", "the first traced step (the first after warm-up)")
    memory_snapshot_file = attr("", "the CUDA allocator snapshot, relative to the record's folder")


class Oom(Section):
    title = "An out-of-memory result (results/oom.py)"
    error = attr("", "the one-line error (a corrupt group: why its file is unusable)")
    oom_step = attr("step", "the first step that ran out of memory (-1: before the loop)")
    oom_ranks = attr("JSON list", "the ranks that ran out of memory")


class Plan(Section):
    title = "The planner's verdict (predicted-oom records: campaign/supervise.py)"
    predicted_peak_gib = attr("GiB", "the planner's predicted peak per rank")
    predicted_required_gib = attr("GiB", "what the rung would need on the device")
    plan_device = attr("", "the planner device key")


class MaxBatch(Section):
    title = "The max-batch search (b`max` rungs: campaign/maxbatch.py)"
    max_batch = attr("count", "the largest local batch that trained (0: none)")
    maxbatch_probes = attr("count", "probes run")
    maxbatch_start = attr("count", "the batch the search started from")
    maxbatch_planned = attr("count", "the planner's max batch (0: no prediction)")
    maxbatch_capped = attr("bool", "the search stopped at its cap")
    maxbatch_cap = attr("count", "the cap (0: none)")
    maxbatch_max_retries = attr("count", "allocator retries a passing probe may have")
    maxbatch_final_retries = attr("count", "the full rung's allocator retries after warm-up")
    maxbatch_note = attr("", "set when the full rung's retries exceed the threshold")


class Repeats(Section):
    title = "Between runs (ladder file, `repeats: R > 1`: results/aggregate.py, results/stats.py between_runs)"
    repeats = attr("count", "runs of the rung (its items_per_s and interval are then the between-run ones)")
    items_per_s_repeats = attr("JSON list", "each repeat's items/s")
    between_run_cv = attr("fraction", "sd / mean of the repeats' items/s")
    within_run_rel_halfwidth = attr("fraction", "median over repeats of each run's interval half-width / value")
    repeat_statuses = attr("JSON list", "each repeat's status")


class Source(Section):
    title = "Where a ladder group came from (results/aggregate.py)"
    source_file = attr("", "the rung file copied in")
    source_sha256 = attr("", "its SHA-256")


class Corrupt(Section):
    title = "A rung whose file could not be used (ladder file: results/aggregate.py)"
    redo = attr("", "the command that runs the rung's job again")


class Convergence(Section):
    title = "A convergence rung (campaign/converge.py; docs/metrics.md, 'Convergence rungs')"
    kind = attr("", "`convergence`")
    test_data = attr("", "the held-out shards")
    target = attr("fraction", "the held-out accuracy to reach")
    eval_every = attr("count", "steps between evaluations")
    step_budget = attr("count", "steps allowed")
    augment = attr("bool", "trained with the ViT augmentation")
    train_samples = attr("count", "training samples")
    test_samples = attr("count", "held-out samples")
    steps_trained = attr("count", "steps run")
    train_s = attr("s", "training time, evaluations excluded")
    eval_s = attr("s", "evaluation time")
    epochs = attr("count", "passes over the training samples")
    final_test_accuracy = attr("fraction", "held-out accuracy at the last evaluation")
    best_test_accuracy = attr("fraction", "the best held-out accuracy")
    time_to_target_s = attr("s", "training time to the target (NaN: missed)")
    steps_to_target = attr("count", "steps to the target (-1: missed)")
    injected_nonlearner = attr("bool", "a test's injected non-learner ($SCALELADDER_INJECT_NONLEARNER)")


class LadderFile(Section):
    title = "The ladder file's root (results/aggregate.py)"
    format = attr("", "`scaleladder-ladder/1`")
    created_utc = attr("ISO 8601", "when it was aggregated")
    scaleladder_version = attr("", "the package version")
    git_commit = attr("", "the checkout's commit")
    n_rungs = attr("count", "rungs")
    status_counts = attr("JSON object", "rungs per status")
    sources = attr("JSON list", "every rung file with its repeat, SHA-256 and status")
    provenance = attr("JSON object", "the workflow's description of the ladder")


class Read(Section):
    title = "Added by the readers (results.aggregate.read_ladder, figures/convergence.py), never stored"
    stored = False
    spec_batch = attr("", "the batch the rung was declared with (`max` for a max-batch search)")
    step_time_s = attr("s", "the step_time_s dataset, every step")
    loss = attr("", "the loss dataset, every step")
    eval_step = attr("step", "convergence: the eval/step dataset")
    eval_accuracy = attr("fraction", "convergence: the eval/test_accuracy dataset")
    eval_train_s = attr("s", "convergence: the eval/train_s dataset")
    path = attr("", "convergence: the record's file")


class FailedAttempt(Section):
    title = "A failed attempt's note (`results/failed/<spec>.h5.json`, a JSON list: campaign/supervise.note_failure)"
    when = attr("ISO 8601", "when the attempt ended")
    rc = attr("", "the launcher's exit code")
    reason = attr("", "one line: what failed; no result was written")


# -- record kinds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A record kind: where it lives and the sections (plus single fields) it may hold."""

    name: str
    where: str
    sections: tuple[type[Section], ...]
    fields: tuple[Attr, ...] = ()

    def names(self) -> frozenset[str]:
        return frozenset(str(a) for s in self.sections for a in s.fields) | frozenset(self.fields)


RUNG = (Record, Spec, Settings, Build, Placement, Provenance)
RUNG_FILE = "`results/rungs/<spec>.h5`"
OK = Kind("ok", RUNG_FILE, (*RUNG, Peak, Throughput, Interval, Memory, Host, Compile, Startup, Loader, Profiling, MaxBatch))
OOM = Kind("oom", RUNG_FILE, (*RUNG, Oom, MaxBatch))
PREDICTED_OOM = Kind("predicted-oom", RUNG_FILE, (*RUNG, Oom, Plan, MaxBatch))
CONVERGENCE = Kind("convergence", "`results/converge/rungs/<strategy>/<precision>/s<seed>.h5`", (*RUNG, Convergence),
                   (Throughput.samples_per_s, Throughput.items_per_s, Throughput.final_loss))
LADDER_RUNG = Kind("ladder group", "ladder file, `/rungs/<spec>`: a rung file's record plus these",
                   (Source, Repeats))
CORRUPT = Kind("corrupt", "ladder file, `/rungs/<spec>`", (Record, Corrupt, Source), (Spec.spec, Oom.error))
LADDER = Kind("ladder", "ladder file, root", (LadderFile,))
FAILED = Kind("failed attempt", "`results/failed/<spec>.h5.json`, one object per attempt", (FailedAttempt,), (Spec.spec,))
KINDS = (OK, OOM, PREDICTED_OOM, CONVERGENCE, LADDER_RUNG, CORRUPT, LADDER, FAILED)
#: A rung file of a status none of the above has (a probe that failed some other way, in tests)
ANY_RUNG = Kind("rung file", RUNG_FILE, tuple(dict.fromkeys(s for k in (OK, OOM, PREDICTED_OOM, CONVERGENCE) for s in k.sections)),
                CONVERGENCE.fields)
SECTIONS: tuple[type[Section], ...] = tuple(Section.__subclasses__())

OOM_STATUSES = ("oom", "predicted-oom")


class UnknownAttr(ValueError):
    """A writer used an attribute name this module does not define (a programming error)."""


def kind_of(attrs: Mapping[str, Any]) -> Kind:
    """The kind a rung-file record is, by its ``kind`` and ``status``."""
    if attrs.get(Convergence.kind) == "convergence":
        return CONVERGENCE
    return {"ok": OK, "oom": OOM, "predicted-oom": PREDICTED_OOM}.get(str(attrs.get(Record.status)), ANY_RUNG)


#: "1": an undefined name is an error (the test suite sets it, tests/conftest.py, for itself and
#: every process it starts); otherwise a warning, and the record is written whole.
STRICT_ENV = "SCALELADDER_STRICT_RECORDS"


def checked(attrs: Mapping[str, Any], kind: Kind | None = None) -> dict[str, Any]:
    """``attrs`` as a plain dict, every name checked against its kind (``kind_of`` when not
    given). A stray name is :class:`UnknownAttr` under ``SCALELADDER_STRICT_RECORDS=1`` (the
    tests), else one warning line and the attribute is kept.
    TRAP: never an error in a real run: a rung writes its record after hours of a GPU
    allocation (a name only a GPU path adds, e.g. the decode's), and losing the record over a
    missing line here would cost the run. The tests catch the name instead."""
    kind = kind or kind_of(attrs)
    allowed = kind.names()
    for k in attrs:
        if k not in allowed:
            msg = (f"record attribute {k!r} is not defined for a {kind.name!r} record: add it to a section "
                   "of src/scaleladder/results/record.py (and regenerate docs/design.md's table)")
            if os.environ.get(STRICT_ENV) == "1":
                raise UnknownAttr(msg)
            get_logger(__name__).warning(f"scaleladder: warning: {msg}; written as it is")
    return {str(k): v for k, v in attrs.items()}


# -- the table in docs/design.md --------------------------------------------------------------


def markdown() -> str:
    """The kinds and every section's attributes, as Markdown (docs/design.md, "Result file")."""
    kinds = [(k.name, k.where, ", ".join([s.__name__ for s in k.sections] + [f"`{a}`" for a in k.fields])) for k in KINDS]
    out = [*md.table(("record kind", "where", "sections"), kinds), ""]
    for s in SECTIONS:
        out += [f"**{s.__name__}**: {s.title}", ""]
        out += [*md.table(("attribute", "unit", "meaning"), [(f"`{a}`", a.unit or "-", a.doc) for a in s.fields], escape=True), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaleladder.results.record", description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true", help="print the attribute tables (docs/design.md, 'Result file')")
    args = p.parse_args(argv)
    if not args.markdown:
        p.print_help()
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
