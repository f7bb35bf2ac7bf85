"""The validated config, typed: :class:`SiteConfig`, read once when the DAG is built.

GENERATED from workflow/schemas/config.schema.yaml by ``python -m scaleladder.site.settings_codegen``:
do not edit; change the schema and regenerate (tests/test_settings.py fails when the two differ).

:func:`scaleladder.site.ladder.prepare` validates Snakemake's config dict (site/config.py), filling
the schema's defaults, and reads it ONCE into these frozen dataclasses; the rules (``SETTINGS`` in
common.smk) and site/commands.py read their fields. A field is ``None`` where the schema declares
no default and the config gives none. ``site.env`` and the other free-form mappings are tuples of
``(key, value)`` pairs in the config's order.
"""

# ruff: noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scaleladder.site import settings_read as read

__all__ = ['Budget', 'Converge', 'Data', 'LadderBlock', 'Link', 'LinkFigures', 'Links', 'Loader', 'MaxBatch', 'Profiling', 'Select', 'Site', 'SiteConfig', 'Timing', 'Trackers']



@dataclass(frozen=True)
class Site:
    """The config's ``site``."""

    name: str  #: the site's name, recorded in the report
    ranks_per_node: int | Literal['auto']  #: ranks started per node; 'auto' = every visible GPU, or cpu_ranks when there is none
    scaleladder: str  #: SHELL: how to call scaleladder on the node that runs a job (may contain {image}); a shell command prefix, not quoted
    launcher: str  #: SHELL: the launcher PREFIX that starts the ranks and ends with the program (placeholders {nodes} {ranks} {ranks_per_node} {image}); a shell command prefix, not quoted: quote any path in it yourself ("$PWD")
    supervise: Literal['launch', 'finalize']  #: launch: `scaleladder launch --launcher PREFIX` starts the ranks itself; finalize: the rule runs `PREFIX run` and then `scaleladder finalize --rc $?` (an Apptainer-only site, where scaleladder cannot call srun)
    requires: tuple[tuple[str, str], ...] | None = None  #: what every job needs, said while the DAG is built: an environment variable -> what it is, or 'image' -> site.image must exist (scaleladder.site.site_check)
    cpu_ranks: int = 2  #: ranks_per_node when 'auto' finds no GPU
    device: Literal['auto', 'cuda', 'cpu'] = 'auto'  #: the rungs' --device. cuda: a rank that sees no GPU fails with the cause (CPU-only torch, a driver too old for its CUDA, no visible device) instead of training on the CPU; auto: a GPU if torch sees one, else the CPU (an error too where Slurm allocated GPUs)
    max_nodes: int | None = None  #: largest node count this site's launcher can start
    plan_device: str = ''  #: planner device key for the predicted-OOM check; empty = no check
    image: str = ''  #: SHELL: container image, substituted for {image} (which the profiles write as "{image}"); may use shell variables
    max_batch_cap: int | None = None  #: never probe a batch above this in the max-batch search (on a CPU, the search's only end)
    local_data: bool = False  #: run the shard rules where Snakemake runs, not as cluster jobs (a partition that allocates whole nodes bills a node for minutes of shard writing)
    supervisor_can_launch: bool = True  #: whether `site.scaleladder` can run `site.launcher` (the max-batch search needs it)
    env: tuple[tuple[str, str | int], ...] = ()  #: SHELL: exported before every job's command as export K="V"; values may use $VARS, ${VAR:?why} and $(...)
    prologue: str = ''  #: SHELL: run before a rung's launcher (e.g. a cache directory on every node); placeholders as in launcher
    time_limit_min: int | None = None  #: the batch system's wall-time limit for one job at this site's node counts, in minutes (Slurm: the partition's MaxTime). Each rung's job then asks for its own time, the time model's prediction with budget.margin and budget.slack_s, under this limit; a rung predicted past it runs fewer steps where its interval still holds, else is refused; packs are filled up to it. Absent: no batch system (a workstation), and no time is asked
    pack: bool | int = False  #: pack the rungs of one node count into one batch job each, run one after another by `scaleladder pack` inside the allocation (docs/workflow.md, "Packs"): true fills each job up to time_limit_min from the time model; N puts N rungs in each (a pack predicted past the limit is refused); false: one job per rung. Needs a batch system (time_limit_min)

    @classmethod
    def of(cls, section: object, key: str) -> Site:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('name', 'requires', 'ranks_per_node', 'cpu_ranks', 'device', 'max_nodes', 'plan_device', 'image', 'scaleladder', 'launcher', 'supervise', 'max_batch_cap', 'local_data', 'supervisor_can_launch', 'env', 'prologue', 'time_limit_min', 'pack'))
        return cls(
            name=read.required(m, 'name', key),
            requires=read.pairs(m['requires']) if m.get('requires') is not None else None,
            ranks_per_node=read.required(m, 'ranks_per_node', key),
            cpu_ranks=m['cpu_ranks'] if 'cpu_ranks' in m else 2,
            device=m['device'] if 'device' in m else 'auto',
            max_nodes=m['max_nodes'] if 'max_nodes' in m else None,
            plan_device=m['plan_device'] if 'plan_device' in m else '',
            image=m['image'] if 'image' in m else '',
            scaleladder=read.required(m, 'scaleladder', key),
            launcher=read.required(m, 'launcher', key),
            supervise=read.required(m, 'supervise', key),
            max_batch_cap=m['max_batch_cap'] if 'max_batch_cap' in m else None,
            local_data=m['local_data'] if 'local_data' in m else False,
            supervisor_can_launch=m['supervisor_can_launch'] if 'supervisor_can_launch' in m else True,
            env=read.pairs(m['env']) if m.get('env') is not None else read.pairs({}),
            prologue=m['prologue'] if 'prologue' in m else '',
            time_limit_min=m['time_limit_min'] if 'time_limit_min' in m else None,
            pack=m['pack'] if 'pack' in m else False,
        )


@dataclass(frozen=True)
class LadderBlock:
    """The config's ``ladders``."""

    models: tuple[str, ...]
    strategies: tuple[str, ...]
    batches: tuple[int | Literal['max'], ...]
    name: str | None = None
    precisions: tuple[str, ...] = ('fp32',)
    knobs: tuple[str, ...] = ('pre-lag',)
    nodes: tuple[int, ...] = (1,)

    @classmethod
    def of(cls, section: object, key: str) -> LadderBlock:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('name', 'models', 'strategies', 'precisions', 'knobs', 'batches', 'nodes'))
        return cls(
            name=m['name'] if 'name' in m else None,
            models=tuple(read.required(m, 'models', key)),
            strategies=tuple(read.required(m, 'strategies', key)),
            precisions=tuple(m['precisions']) if m.get('precisions') is not None else ('fp32',),
            knobs=tuple(m['knobs']) if m.get('knobs') is not None else ('pre-lag',),
            batches=tuple(read.required(m, 'batches', key)),
            nodes=tuple(m['nodes']) if m.get('nodes') is not None else (1,),
        )


@dataclass(frozen=True)
class Loader:
    """the site's input pipeline for --data rungs (set in profiles/<site>/site.yaml): workers per rank (overrides 'workers'), where JPEGs are decoded and how images cross from the workers to the rank; see docs/data.md"""

    workers: int | None = None  #: data-loader workers per rank
    decode: Literal['cpu', 'gpu'] = 'cpu'  #: 'cpu': decode + transforms in the workers (the reference); 'gpu': workers pass encoded JPEGs, nvJPEG decode + transforms batched on the device
    transport: Literal['uint8', 'float32'] = 'uint8'  #: decode cpu: the workers' images cross to the rank as uint8 and are normalised on the device, or as float32, normalised in the workers (the reference)

    @classmethod
    def of(cls, section: object, key: str) -> Loader:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('workers', 'decode', 'transport'))
        return cls(
            workers=m['workers'] if 'workers' in m else None,
            decode=m['decode'] if 'decode' in m else 'cpu',
            transport=m['transport'] if 'transport' in m else 'uint8',
        )


@dataclass(frozen=True)
class Profiling:
    """when a number surprises, one run explains it (rung/profiling.py): every rung of the ladder writes a torch.profiler trace of trace_steps steps after its warm-up and/or a CUDA allocator memory snapshot next to its record (off by default; both slow the rung); and how often rank 0 says it is alive"""

    trace_steps: int = 0  #: steps traced right after the warm-up (0: off); at most steps - warmup
    memory_snapshot: bool = False  #: record the CUDA allocator's history (GPU rungs only)
    progress_s: float = 30.0  #: seconds between rank 0's progress lines in a rung's log (0: none)

    @classmethod
    def of(cls, section: object, key: str) -> Profiling:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('trace_steps', 'memory_snapshot', 'progress_s'))
        return cls(
            trace_steps=m['trace_steps'] if 'trace_steps' in m else 0,
            memory_snapshot=m['memory_snapshot'] if 'memory_snapshot' in m else False,
            progress_s=m['progress_s'] if 'progress_s' in m else 30.0,
        )


@dataclass(frozen=True)
class Trackers:
    """opt-in trackers (docs/metrics.md, "Trackers"): each rung's per-step scalars for TensorBoard, and one MLflow run per rung, logged after aggregate by one process; neither can cost a result"""

    tensorboard: str | None = None  #: a folder for each rung's TensorBoard events, <folder>/<spec>/ (e.g. results/tensorboard); needs the tensorboard extra
    mlflow_uri: str | None = None  #: an MLflow tracking URI (sqlite:///results/mlflow.db: a local store, offline; http(s)://host:port: a tracking server); the rule `mlflow` logs one run per rung after aggregate; needs the mlflow extra
    mlflow_experiment: str = 'scaleladder'  #: the MLflow experiment the runs go to

    @classmethod
    def of(cls, section: object, key: str) -> Trackers:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('tensorboard', 'mlflow_uri', 'mlflow_experiment'))
        return cls(
            tensorboard=m['tensorboard'] if 'tensorboard' in m else None,
            mlflow_uri=m['mlflow_uri'] if 'mlflow_uri' in m else None,
            mlflow_experiment=m['mlflow_experiment'] if 'mlflow_experiment' in m else 'scaleladder',
        )


@dataclass(frozen=True)
class LinkFigures:
    """The config's ``all_reduce``."""

    alpha_us: float  #: latency per message, microseconds
    gbps: float  #: bandwidth per direction, GB/s

    @classmethod
    def of(cls, section: object, key: str) -> LinkFigures:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('alpha_us', 'gbps'))
        return cls(
            alpha_us=read.required(m, 'alpha_us', key),
            gbps=read.required(m, 'gbps', key),
        )


@dataclass(frozen=True)
class Link:
    """The config's ``intra_pair``."""

    alpha_us: float  #: latency per message, microseconds
    gbps: float  #: bandwidth per direction, GB/s (inter_node: the node's, all NICs)
    all_reduce: LinkFigures | None = None  #: the all-reduce's own fit (planner/comm.py)
    all_gather: LinkFigures | None = None  #: the all-gather's own fit
    reduce_scatter: LinkFigures | None = None  #: the reduce-scatter's own fit

    @classmethod
    def of(cls, section: object, key: str) -> Link:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('alpha_us', 'gbps', 'all_reduce', 'all_gather', 'reduce_scatter'))
        return cls(
            alpha_us=read.required(m, 'alpha_us', key),
            gbps=read.required(m, 'gbps', key),
            all_reduce=LinkFigures.of(m['all_reduce'], read.key_of(key, 'all_reduce')) if m.get('all_reduce') is not None else None,
            all_gather=LinkFigures.of(m['all_gather'], read.key_of(key, 'all_gather')) if m.get('all_gather') is not None else None,
            reduce_scatter=LinkFigures.of(m['reduce_scatter'], read.key_of(key, 'reduce_scatter')) if m.get('reduce_scatter') is not None else None,
        )


@dataclass(frozen=True)
class Links:
    """The config's ``links``."""

    intra_pair: Link | None = None
    pair_ranks: int | None = None  #: ranks joined by intra_pair (Frontier: the 2 GCDs of one MI250X)
    backend: Literal['nccl', 'gloo'] | None = None  #: which algorithms run (planner/comm.py): gloo reduce-scatters by a whole all-reduce, all-reduces by a ring
    intra_node: Link | None = None
    inter_node: Link | None = None

    @classmethod
    def of(cls, section: object, key: str) -> Links:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('intra_pair', 'pair_ranks', 'backend', 'intra_node', 'inter_node'))
        return cls(
            intra_pair=Link.of(m['intra_pair'], read.key_of(key, 'intra_pair')) if m.get('intra_pair') is not None else None,
            pair_ranks=m['pair_ranks'] if 'pair_ranks' in m else None,
            backend=m['backend'] if 'backend' in m else None,
            intra_node=Link.of(m['intra_node'], read.key_of(key, 'intra_node')) if m.get('intra_node') is not None else None,
            inter_node=Link.of(m['inter_node'], read.key_of(key, 'inter_node')) if m.get('inter_node') is not None else None,
        )


@dataclass(frozen=True)
class Timing:
    """the step time's site figures (`scaleladder plan --profile`, `budget`; planner/steptime.py, docs/planner.md "Step time"): the links collectives cross (alpha-beta, per direction), the host's speed against the calibration host, the compile time of a -compile rung"""

    links: Links | None = None
    cpu_factor: float | None = None  #: host time per aten op against the calibration host's (1.0 = as fast)
    compile_s: float | None = None  #: seconds a -compile rung spends compiling, on top of the start-up

    @classmethod
    def of(cls, section: object, key: str) -> Timing:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('links', 'cpu_factor', 'compile_s'))
        return cls(
            links=Links.of(m['links'], read.key_of(key, 'links')) if m.get('links') is not None else None,
            cpu_factor=m['cpu_factor'] if 'cpu_factor' in m else None,
            compile_s=m['compile_s'] if 'compile_s' in m else None,
        )


@dataclass(frozen=True)
class Budget:
    """the time model of `scaleladder budget` and of the time each rung's job asks for (campaign/cost.py, campaign/timelimit.py): a step predicted by the planner (else local batch x model FLOPs per sample / (the device's peak x MFU)), until finished rungs of the same model and strategy calibrate it; the start-up a job pays once and the one each rung pays; the margin on the time asked"""

    mfu: tuple[tuple[str, float], ...] | None = None  #: stated MFU per strategy name, else per wrapper (ddp, fsdp, fsdp2, single), else 'default'
    job_startup_s: float | None = None  #: seconds a batch job pays once, outside its rungs (allocation, container image read on every node, first imports from cold caches)
    rung_startup_s: float | None = None  #: seconds each rung pays outside its steps, in a pack too (the launcher's step, the ranks' processes and imports, the process group, the first batch); finished rungs' records replace it
    margin: float = 1.5  #: a job's time asked = margin x predicted + slack_s (1.5: the step-time model's worst under-prediction against the H100 was 23%, docs/planner.md)
    slack_s: float = 300  #: seconds added to every time asked, on top of the margin (start-up and file-system jitter)
    device: str | None = None  #: the device the time model prices a step on, where it is not site.plan_device (a site of CPU ranks: cpu)

    @classmethod
    def of(cls, section: object, key: str) -> Budget:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('mfu', 'job_startup_s', 'rung_startup_s', 'margin', 'slack_s', 'device'))
        return cls(
            mfu=read.pairs(m['mfu']) if m.get('mfu') is not None else None,
            job_startup_s=m['job_startup_s'] if 'job_startup_s' in m else None,
            rung_startup_s=m['rung_startup_s'] if 'rung_startup_s' in m else None,
            margin=m['margin'] if 'margin' in m else 1.5,
            slack_s=m['slack_s'] if 'slack_s' in m else 300,
            device=m['device'] if 'device' in m else None,
        )


@dataclass(frozen=True)
class MaxBatch:
    """the max-batch search of `max` rungs (scaleladder maxbatch)"""

    max_retries: int | None = None  #: allocator retries after warm-up a probe may have and still pass (default 0)
    probe_steps: int | None = None  #: steps per probe, warm-up included (default 5)
    probe_warmup: int | None = None  #: warm-up steps per probe (default 2)

    @classmethod
    def of(cls, section: object, key: str) -> MaxBatch:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('max_retries', 'probe_steps', 'probe_warmup'))
        return cls(
            max_retries=m['max_retries'] if 'max_retries' in m else None,
            probe_steps=m['probe_steps'] if 'probe_steps' in m else None,
            probe_warmup=m['probe_warmup'] if 'probe_warmup' in m else None,
        )


@dataclass(frozen=True)
class Converge:
    """the convergence rungs (workflow/rules/converge.smk, `scaleladder converge`): train `model` per strategy x precision x seed to `target` held-out accuracy within `steps`; a rung that misses is a failing result in the report (docs/metrics.md, "Convergence rungs")"""

    enabled: bool = False
    model: str = 'vit-debug'  #: a ViT flavor (a classifier)
    strategies: tuple[str, ...] = ('single', 'ddp', 'fsdp-full')
    precisions: tuple[str, ...] = ('fp32', 'bf16-mixed', 'fp16-mixed', 'bf16-true')
    seeds: tuple[int, ...] = (0,)
    global_batch: int = 32  #: samples per step over all ranks (local = global / ranks)
    lr: float = 0.001
    target: float = 0.8  #: held-out accuracy to reach
    steps: int = 600  #: the step budget
    eval_every: int = 50
    train: str = 'digits'  #: DATA (quoted): 'digits' (scikit-learn's, exported and sharded here) or a shard manifest
    test: str = 'digits'  #: DATA (quoted): 'digits' or the held-out shard manifest

    @classmethod
    def of(cls, section: object, key: str) -> Converge:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('enabled', 'model', 'strategies', 'precisions', 'seeds', 'global_batch', 'lr', 'target', 'steps', 'eval_every', 'train', 'test'))
        return cls(
            enabled=m['enabled'] if 'enabled' in m else False,
            model=m['model'] if 'model' in m else 'vit-debug',
            strategies=tuple(m['strategies']) if m.get('strategies') is not None else ('single', 'ddp', 'fsdp-full'),
            precisions=tuple(m['precisions']) if m.get('precisions') is not None else ('fp32', 'bf16-mixed', 'fp16-mixed', 'bf16-true'),
            seeds=tuple(m['seeds']) if m.get('seeds') is not None else (0,),
            global_batch=m['global_batch'] if 'global_batch' in m else 32,
            lr=m['lr'] if 'lr' in m else 0.001,
            target=m['target'] if 'target' in m else 0.8,
            steps=m['steps'] if 'steps' in m else 600,
            eval_every=m['eval_every'] if 'eval_every' in m else 50,
            train=m['train'] if 'train' in m else 'digits',
            test=m['test'] if 'test' in m else 'digits',
        )


@dataclass(frozen=True)
class Data:
    """The config's ``data``."""

    source: Literal['embedded', 'synthetic'] = 'embedded'  #: 'embedded': shards made by `scaleladder shard` (its built-in set, or the images/captions/wds given below); 'synthetic': random tensors made on the device, no shard job
    images: str | None = None  #: DATA (quoted; must exist; no control characters): folder of images for `scaleladder shard --images`
    captions: str | None = None  #: DATA (quoted; must exist): caption table for `scaleladder shard --captions`
    wds: tuple[str, ...] | None = None  #: DATA (each quoted): existing WebDataset shards (`--wds`)
    vocab: str | None = None  #: DATA (quoted; must exist): a BERT vocab.txt (`--vocab`), for the real FLAVA flavors
    samples: int = 256
    per_shard: int = 64
    seed: int = 0
    slices: int | None = None  #: (default 1) parallel `scaleladder shard --slice K/N` jobs per shard set (a Slurm batch job each on a Slurm profile, side by side up to --cores locally), then one gather job; the shards are the same bytes for any N

    @classmethod
    def of(cls, section: object, key: str) -> Data:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('source', 'images', 'captions', 'wds', 'vocab', 'samples', 'per_shard', 'seed', 'slices'))
        return cls(
            source=m['source'] if 'source' in m else 'embedded',
            images=m['images'] if 'images' in m else None,
            captions=m['captions'] if 'captions' in m else None,
            wds=tuple(m['wds']) if m.get('wds') is not None else None,
            vocab=m['vocab'] if 'vocab' in m else None,
            samples=m['samples'] if 'samples' in m else 256,
            per_shard=m['per_shard'] if 'per_shard' in m else 64,
            seed=m['seed'] if 'seed' in m else 0,
            slices=m['slices'] if 'slices' in m else None,
        )


@dataclass(frozen=True)
class Select:
    """restrict this invocation to some rungs (e.g. --config 'select={models: [vit-base]}'); the ladder file, figures and report then hold those rungs only (a plain run puts every rung back); a value no rung has is refused, naming the nearest one"""

    models: tuple[str | int, ...] | str | None = None
    strategies: tuple[str | int, ...] | str | None = None
    precisions: tuple[str | int, ...] | str | None = None
    knobs: tuple[str | int, ...] | str | None = None
    nodes: tuple[str | int, ...] | str | int | None = None
    batches: tuple[str | int, ...] | str | int | None = None

    @classmethod
    def of(cls, section: object, key: str) -> Select:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('models', 'strategies', 'precisions', 'knobs', 'nodes', 'batches'))
        return cls(
            models=read.as_tuple(m['models']) if m.get('models') is not None else None,
            strategies=read.as_tuple(m['strategies']) if m.get('strategies') is not None else None,
            precisions=read.as_tuple(m['precisions']) if m.get('precisions') is not None else None,
            knobs=read.as_tuple(m['knobs']) if m.get('knobs') is not None else None,
            nodes=read.as_tuple(m['nodes']) if m.get('nodes') is not None else None,
            batches=read.as_tuple(m['batches']) if m.get('batches') is not None else None,
        )


@dataclass(frozen=True)
class SiteConfig:
    """The whole config, typed: the schema's top level."""

    site: Site
    ladders: tuple[LadderBlock, ...]  #: blocks of rungs; each block is the cross product of its lists
    steps: int  #: timed + warm-up steps per rung
    warmup: int  #: steps excluded from the throughput
    seed: int = 0
    workers: int = 0  #: data-loader workers per rank
    loader: Loader = field(default_factory=lambda: Loader.of({}, 'loader'))  #: the site's input pipeline for --data rungs (set in profiles/<site>/site.yaml): workers per rank (overrides 'workers'), where JPEGs are decoded and how images cross from the workers to the rank; see docs/data.md
    profiling: Profiling = field(default_factory=lambda: Profiling.of({}, 'profiling'))  #: when a number surprises, one run explains it (rung/profiling.py): every rung of the ladder writes a torch.profiler trace of trace_steps steps after its warm-up and/or a CUDA allocator memory snapshot next to its record (off by default; both slow the rung); and how often rank 0 says it is alive
    trackers: Trackers = field(default_factory=lambda: Trackers.of({}, 'trackers'))  #: opt-in trackers (docs/metrics.md, "Trackers"): each rung's per-step scalars for TensorBoard, and one MLflow run per rung, logged after aggregate by one process; neither can cost a result
    models_file: str | None = None  #: DATA (quoted; must exist): a models file (YAML: model name -> a timm, transformers or python entry; docs/your-model.md) whose names a ladder block's models may use; checked when the DAG is made (its syntax) and in the first job that builds a model (what the libraries say); every rung gets it as --models
    run_predicted_oom: bool = False  #: run rungs the planner predicts cannot fit
    repeats: int = 1  #: run every measured rung this many times, each in fresh processes (repeat k >= 1 writes results/rungs/<spec>.r<k>.h5); the ladder keeps every repeat and gives each rung the spread between its runs beside the spread within one (docs/metrics.md)
    timing: Timing = field(default_factory=lambda: Timing.of({}, 'timing'))  #: the step time's site figures (`scaleladder plan --profile`, `budget`; planner/steptime.py, docs/planner.md "Step time"): the links collectives cross (alpha-beta, per direction), the host's speed against the calibration host, the compile time of a -compile rung
    budget: Budget = field(default_factory=lambda: Budget.of({}, 'budget'))  #: the time model of `scaleladder budget` and of the time each rung's job asks for (campaign/cost.py, campaign/timelimit.py): a step predicted by the planner (else local batch x model FLOPs per sample / (the device's peak x MFU)), until finished rungs of the same model and strategy calibrate it; the start-up a job pays once and the one each rung pays; the margin on the time asked
    maxbatch: MaxBatch = field(default_factory=lambda: MaxBatch.of({}, 'maxbatch'))  #: the max-batch search of `max` rungs (scaleladder maxbatch)
    converge: Converge = field(default_factory=lambda: Converge.of({}, 'converge'))  #: the convergence rungs (workflow/rules/converge.smk, `scaleladder converge`): train `model` per strategy x precision x seed to `target` held-out accuracy within `steps`; a rung that misses is a failing result in the report (docs/metrics.md, "Convergence rungs")
    data: Data = field(default_factory=lambda: Data.of({}, 'data'))
    select: Select = field(default_factory=lambda: Select.of({}, 'select'))  #: restrict this invocation to some rungs (e.g. --config 'select={models: [vit-base]}'); the ladder file, figures and report then hold those rungs only (a plain run puts every rung back); a value no rung has is refused, naming the nearest one

    @classmethod
    def of(cls, section: object, key: str) -> SiteConfig:
        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""
        m = read.section(section, key, ('site', 'ladders', 'steps', 'warmup', 'seed', 'workers', 'loader', 'profiling', 'trackers', 'models_file', 'run_predicted_oom', 'repeats', 'timing', 'budget', 'maxbatch', 'converge', 'data', 'select'))
        return cls(
            site=Site.of(read.required(m, 'site', key), read.key_of(key, 'site')),
            ladders=tuple(LadderBlock.of(x, f"{read.key_of(key, 'ladders')}[{i}]") for i, x in enumerate(read.required(m, 'ladders', key))),
            steps=read.required(m, 'steps', key),
            warmup=read.required(m, 'warmup', key),
            seed=m['seed'] if 'seed' in m else 0,
            workers=m['workers'] if 'workers' in m else 0,
            loader=Loader.of(m['loader'], read.key_of(key, 'loader')) if m.get('loader') is not None else Loader.of({}, read.key_of(key, 'loader')),
            profiling=Profiling.of(m['profiling'], read.key_of(key, 'profiling')) if m.get('profiling') is not None else Profiling.of({}, read.key_of(key, 'profiling')),
            trackers=Trackers.of(m['trackers'], read.key_of(key, 'trackers')) if m.get('trackers') is not None else Trackers.of({}, read.key_of(key, 'trackers')),
            models_file=m['models_file'] if 'models_file' in m else None,
            run_predicted_oom=m['run_predicted_oom'] if 'run_predicted_oom' in m else False,
            repeats=m['repeats'] if 'repeats' in m else 1,
            timing=Timing.of(m['timing'], read.key_of(key, 'timing')) if m.get('timing') is not None else Timing.of({}, read.key_of(key, 'timing')),
            budget=Budget.of(m['budget'], read.key_of(key, 'budget')) if m.get('budget') is not None else Budget.of({}, read.key_of(key, 'budget')),
            maxbatch=MaxBatch.of(m['maxbatch'], read.key_of(key, 'maxbatch')) if m.get('maxbatch') is not None else MaxBatch.of({}, read.key_of(key, 'maxbatch')),
            converge=Converge.of(m['converge'], read.key_of(key, 'converge')) if m.get('converge') is not None else Converge.of({}, read.key_of(key, 'converge')),
            data=Data.of(m['data'], read.key_of(key, 'data')) if m.get('data') is not None else Data.of({}, read.key_of(key, 'data')),
            select=Select.of(m['select'], read.key_of(key, 'select')) if m.get('select') is not None else Select.of({}, read.key_of(key, 'select')),
        )
