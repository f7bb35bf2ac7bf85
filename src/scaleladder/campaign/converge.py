"""``scaleladder converge``: train one rung to a held-out accuracy; record time-to-train.

A faster rung is only worth having if it still learns (MLPerf's "time to train"): the rung
trains through the real shard -> WebDataset loader path, in chunks of ``train_loop`` windows,
until the held-out accuracy reaches ``--target`` or ``--steps`` runs out. Not reaching it is
a RESULT (``did-not-converge``, exit 0), never a crash. Under a launcher the command re-runs
itself as ``PREFIX converge ARGS``. Test hook: ``SCALELADDER_INJECT_NONLEARNER=PRECISION``.
Definitions and why: docs/metrics.md, "Convergence rungs".
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from scaleladder.log import get_logger
from scaleladder.models.families import family_of
from scaleladder.rung.run_config import RunConfig, config_from_args
from scaleladder.rung.run_config import add_arguments as add_run_arguments
from scaleladder.spec import SpecError, parse_positive

if TYPE_CHECKING:
    from scaleladder.rung.launch import DistEnv

_log = get_logger(__name__)
KIND = "convergence"
STATUS_OK = "ok"
STATUS_MISSED = "did-not-converge"
INJECT_ENV = "SCALELADDER_INJECT_NONLEARNER"
EVAL_BATCH = 256  # held-out images per forward: memory only, the accuracy does not depend on it


@dataclass(frozen=True)
class ConvergeConfig:
    run: RunConfig  # the rung; run.steps is the step budget, run.data the training shards
    test_data: str  # the held-out shards: a manifest or its directory
    target: float  # held-out accuracy to reach, in (0, 1]
    eval_every: int
    augment: bool

    def argv(self) -> list[str]:
        args = self.run.argv() + ["--test-data", self.test_data, "--target", repr(self.target), "--eval-every", str(self.eval_every)]
        return args + (["--augment"] if self.augment else [])

    def attrs(self) -> dict[str, Any]:
        return {**self.run.attrs(), "kind": KIND, "test_data": self.test_data, "target": self.target,
                "eval_every": self.eval_every, "step_budget": self.run.steps, "augment": self.augment}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    # The run's defaults suit a throughput window; a convergence rung counts every step.
    p.set_defaults(steps="3000", warmup="0", lr="1e-3", workers="0")
    for action in p._actions:  # the run's help says its own defaults ("default 1000", "default 100")
        if action.dest == "warmup":
            action.help = "must be 0 (the default): a convergence rung times every step"
        elif action.dest == "steps":
            action.help = "the step budget, evaluations excluded (default 3000)"
    g = p.add_argument_group("convergence")
    g.add_argument("--test-data", required=True, help="held-out shards (manifest.json or its directory), e.g. from `scaleladder digits`")
    g.add_argument("--target", default="0.9", help="held-out accuracy to reach, in (0, 1] (default 0.9; docs/metrics.md)")
    g.add_argument("--eval-every", default="50", help="steps between evaluations (default 50)")
    g.add_argument("--augment", action="store_true", help="train with the ViT augmentation (random crop, left-right flip)")
    g.add_argument("--launcher", default="", help="command prefix that starts the ranks and ends with the program, e.g. "
                   "'torchrun --standalone --nproc-per-node 2 -m scaleladder' (empty: this process)")


def config_from(a: argparse.Namespace) -> ConvergeConfig:
    run = config_from_args(a)
    if run.warmup != 0:
        raise SpecError(f"--warmup {run.warmup}: a convergence rung times every step (give 0 or leave it out)")
    if run.spec.batch == "max":
        raise SpecError("a convergence rung needs a fixed batch, not 'max'")
    if run.spec.strategy.compile:
        raise SpecError(f"{run.spec.strategy}: -compile rungs are not convergence rungs yet (each chunk would recompile)")
    if not family_of(run.flavor).classifier:
        raise SpecError(f"{run.spec.model}: convergence needs a classifier (a ViT flavor); FLAVA has no held-out accuracy")
    if not isinstance(run.workers, int):
        raise SpecError(f"--workers {run.workers}: a convergence rung takes a count of loader workers (the workflow gives 0)")
    if run.data == "synthetic":
        raise SpecError("--data synthetic: a convergence rung trains on real labelled shards (see `scaleladder digits`)")
    from scaleladder.data.manifest import resolve

    if not resolve(a.test_data).is_file():
        raise SpecError(f"--test-data {a.test_data!r}: no such manifest file or shard directory")
    try:
        target = float(a.target)
    except ValueError:
        raise SpecError(f"--target must be a number, got {a.target!r}") from None
    if not 0.0 < target <= 1.0:
        raise SpecError(f"--target must be in (0, 1], got {target}")
    return ConvergeConfig(run, str(a.test_data), target, parse_positive("eval-every", a.eval_every), bool(a.augment))


def main(args: argparse.Namespace) -> int:
    from scaleladder.rung import launch

    cfg = config_from(args)
    env = launch.detect()
    if args.launcher.strip() and env.source == "single":
        return supervise(cfg, args.launcher)
    from scaleladder.rung.run import check_world

    check_world(cfg.run, env.world, env.nodes)
    if env.rank == 0:  # the writer: a read-only or full results/ fails now, not after training
        from scaleladder.results.store import check_writable, record_bytes

        check_writable(cfg.run.out, record_bytes(cfg.run.steps))
    device = launch.pick_device(env, cfg.run.device)
    launch.init(env, device)
    try:
        return _converge(cfg, env, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def supervise(cfg: ConvergeConfig, launcher: str) -> int:
    """Run the ranks under ``launcher``; a failed launch leaves no record behind."""
    cmd = f"{launcher} converge {shlex.join(cfg.argv())}"
    _log.info(f"scaleladder converge: {cmd}")
    rc = subprocess.call(cmd, shell=True)
    if rc == 0 and cfg.run.out.is_file():
        return 0
    cfg.run.out.unlink(missing_ok=True)
    print(f"scaleladder converge: {cfg.run.spec.path}: the launch failed with exit code {rc}; no result written", file=sys.stderr)
    return rc or 1


# -- the held-out set -------------------------------------------------------------------


def load_test_set(test_data: str, flavor: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every held-out sample once, in shard order: (images [N,3,S,S] fp32, labels [N]).

    Read with the loader's own transform (no augmentation: the whole image, resized),
    straight from the shards, so train and test images are decoded the same way.
    """
    import webdataset as wds

    from scaleladder.data.data_errors import DataError
    from scaleladder.data.manifest import read_manifest
    from scaleladder.data.transforms import VitTransform

    m = read_manifest(test_data)
    if not m.labelled:
        raise DataError(f"{m.path}: not every held-out sample has a label")
    transform = VitTransform(flavor, seed, 0, 1, augment=False)
    pipeline = wds.DataPipeline(wds.SimpleShardList([str(s.path) for s in m.shards]), wds.tarfile_to_samples(), wds.map(transform))
    samples = list(pipeline)
    if len(samples) != m.samples:
        raise DataError(f"{m.path}: read {len(samples)} held-out samples, the manifest says {m.samples}")
    return torch.stack([s["image"] for s in samples]), torch.stack([s["label"] for s in samples])


def _head(model: torch.nn.Module) -> torch.nn.Module:
    """The classifier head inside any wrapper (DDP's ``module.``, FSDP's ``_fsdp_wrapped_module.``)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "head":
            head: torch.nn.Module = module
            return head
    raise SpecError(f"{type(model).__name__}: no classifier head to read logits from")


@torch.no_grad()
def evaluate(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, prec: Any, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on the held-out set, on every rank alike."""
    captured: list[torch.Tensor] = []
    hook = _head(model).register_forward_hook(lambda _m, _i, out: captured.append(out.detach().float()))
    model.eval()
    correct, loss_sum = 0, 0.0
    try:
        for i in range(0, len(labels), EVAL_BATCH):
            batch = {"image": images[i:i + EVAL_BATCH].to(device, prec.storage_dtype), "label": labels[i:i + EVAL_BATCH].to(device)}
            captured.clear()
            with prec.autocast(device):
                loss = model(batch)
            correct += int((captured[-1].argmax(dim=1) == batch["label"]).sum())
            loss_sum += float(loss) * len(batch["label"])
    finally:
        hook.remove()
        model.train()
    return correct / len(labels), loss_sum / len(labels)


# -- the rung ---------------------------------------------------------------------------


@dataclass
class _Built:
    """A convergence rung ready to train: its model, optimizer, data and held-out set."""

    batch: int
    prec: Any
    where: dict[str, Any]  # rung.run.placement: the host and device the record names
    test_images: torch.Tensor
    test_labels: torch.Tensor
    loader: Any
    feed: Any  # one endless stream of device batches, sliced into chunks
    wrapped: torch.nn.Module
    report: Any  # rung.parallelize's WrapReport (fsdp_units)
    params: int
    optimizer: torch.optim.Optimizer
    scaler: Any
    injected: bool  # the non-learner test hook (INJECT_ENV) is on for this precision


@dataclass
class _Curve:
    """What the chunks and evaluations recorded, one entry per evaluation."""

    eval_steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    test_loss: list[float] = field(default_factory=list)
    train_s_at: list[float] = field(default_factory=list)
    eval_s: list[float] = field(default_factory=list)
    losses: list[np.ndarray] = field(default_factory=list)
    step_times: list[np.ndarray] = field(default_factory=list)
    train_s: float = 0.0
    done: int = 0  # steps trained
    reached: bool = False


def _converge(cfg: ConvergeConfig, env: DistEnv, device: torch.device) -> int:
    built = _build(cfg, env, device)
    curve = _train_to_target(cfg, env, device, built)
    if env.rank != 0:
        return 0
    _record(cfg, env, built, curve)
    return 0


def _build(cfg: ConvergeConfig, env: DistEnv, device: torch.device) -> _Built:
    from scaleladder.data.loader import make_loader
    from scaleladder.rung import provenance
    from scaleladder.rung.feed import DeviceFeed
    from scaleladder.rung.optim import make_optimizer, make_scaler
    from scaleladder.rung.precision import policy
    from scaleladder.rung.run import build_wrapped, placement

    run, spec = cfg.run, cfg.run.spec
    flavor = run.flavor
    where = placement(env, device, provenance.hosts())
    prec = policy(spec.precision)
    prec.apply_backend_flags()
    batch = int(spec.batch)
    test_images, test_labels = load_test_set(cfg.test_data, flavor, run.seed)
    assert isinstance(run.workers, int)  # config_from refused "auto"
    loader = make_loader(run.data, flavor, batch, env.rank, env.world, run.steps, run.workers, run.seed,
                         pin_memory=device.type == "cuda", augment=cfg.augment)
    feed = iter(DeviceFeed(loader, device, prec.storage_dtype, run.steps))
    wrapped, report, params = build_wrapped(run, "device", device, prec)
    optimizer = make_optimizer(wrapped.parameters(), run.lr, spec.precision)
    injected = os.environ.get(INJECT_ENV, "") == spec.precision
    if injected:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
    scaler = make_scaler(spec.precision, spec.strategy, device)
    return _Built(batch, prec, where, test_images, test_labels, loader, feed, wrapped, report, params, optimizer,
                  scaler, injected)


def _train_to_target(cfg: ConvergeConfig, env: DistEnv, device: torch.device, built: _Built) -> _Curve:
    """Chunks of ``eval_every`` timed steps, each followed by an evaluation, until the target
    or the step budget; rank 0 says where it stands after each."""
    from scaleladder.rung.loop import train_loop

    run, spec = cfg.run, cfg.run.spec
    curve = _Curve()
    while curve.done < run.steps and not curve.reached:
        n = min(cfg.eval_every, run.steps - curve.done)
        m = train_loop(built.wrapped, built.optimizer, itertools.islice(built.feed, n), steps=n, warmup=0,
                       prec=built.prec, device=device, scaler=built.scaler)
        curve.train_s += m.window_s
        curve.done += n
        curve.losses.append(m.loss)
        curve.step_times.append(m.step_time_s)
        t0 = time.perf_counter()
        acc, tl = evaluate(built.wrapped, built.test_images, built.test_labels, built.prec, device)
        curve.eval_s.append(time.perf_counter() - t0)
        curve.eval_steps.append(curve.done)
        curve.accuracy.append(acc)
        curve.test_loss.append(tl)
        curve.train_s_at.append(curve.train_s)
        curve.reached = acc >= cfg.target
        if env.rank == 0:
            _log.info(f"{spec.path}: step {curve.done}: held-out accuracy {acc:.4f} (target {cfg.target}), "
                      f"train {curve.train_s:.1f} s")
    return curve


def _record(cfg: ConvergeConfig, env: DistEnv, built: _Built, curve: _Curve) -> None:
    """Rank 0 writes the convergence record and prints its one-line verdict."""
    from scaleladder.results.store import write_record
    from scaleladder.rung import provenance

    run, spec = cfg.run, cfg.run.spec
    batch, done, train_s, reached, accuracy = built.batch, curve.done, curve.train_s, curve.reached, curve.accuracy
    status = STATUS_OK if reached else STATUS_MISSED
    samples_per_s = batch * env.world * done / train_s
    attrs: dict[str, Any] = {
        "status": status,
        **cfg.attrs(),
        "world_size": env.world,
        "params": built.params,
        "fsdp_units": built.report.fsdp_units,
        "init": "device",
        **provenance.collect(built.where["device_name"]),
        **built.where,
        "train_samples": int(built.loader.manifest.samples),
        "test_samples": int(len(built.test_labels)),
        "steps_trained": done,
        "train_s": train_s,
        "eval_s": float(sum(curve.eval_s)),
        "samples_per_s": samples_per_s,
        "items_per_s": samples_per_s,  # ViT: one item per sample
        "epochs": batch * env.world * done / built.loader.manifest.samples,
        "final_test_accuracy": accuracy[-1],
        "best_test_accuracy": max(accuracy),
        "final_loss": float(curve.losses[-1][-1]),
        "time_to_target_s": train_s if reached else math.nan,
        "steps_to_target": done if reached else -1,
        "injected_nonlearner": built.injected,
    }
    datasets = {
        "eval/step": np.asarray(curve.eval_steps, dtype=np.int64),
        "eval/test_accuracy": np.asarray(accuracy),
        "eval/test_loss": np.asarray(curve.test_loss),
        "eval/train_s": np.asarray(curve.train_s_at),
        "eval/eval_s": np.asarray(curve.eval_s),
        "loss": np.concatenate(curve.losses),
        "step_time_s": np.concatenate(curve.step_times),
    }
    write_record(run.out, attrs, datasets)
    verdict = (f"reached {cfg.target} at step {done} after {train_s:.1f} s of training" if reached
               else f"DID NOT CONVERGE: best held-out accuracy {max(accuracy):.4f} < target {cfg.target} in {done} steps")
    print(f"{spec.path}: {verdict} ({samples_per_s:.1f} samples/s) -> {run.out}", file=sys.stderr)
