"""The loader: WebDataset shards -> exactly ``steps`` batches of one rank's local batch.

Per reader (one rank x one DataLoader worker): an endless, explicitly split, resampled
:class:`ShardStream` (every shard checked before the first batch), webdataset's samples,
a seeded shuffle, the transforms and collation in the worker, and ``.with_epoch(steps)``
on the loader to cut it, so every rank yields exactly ``steps`` batches and the loader
never restarts mid-run. The pipeline and the webdataset traps it avoids (#188, #225):
docs/data.md, "Loader".
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import torch
import webdataset as wds
from torch.utils.data import IterableDataset

from scaleladder.data import cores, preflight, readers
from scaleladder.data.data_errors import DataError, one_line
from scaleladder.data.devdecode import DeviceDecoder, check_decode
from scaleladder.data.devnorm import DeviceNormaliser
from scaleladder.data.manifest import Manifest, ShardEntry, read_manifest, sha256_file
from scaleladder.data.pair_transforms import ImageTextTransform, ImageTransform, TextTransform, check_tokenizer
from scaleladder.data.tokenizer import check_vocab, load_tokenizer
from scaleladder.data.transforms import TRANSPORTS, FlavaTransform, VitTransform, collate
from scaleladder.flavors import Flavor
from scaleladder.log import get_logger
from scaleladder.models.families import family_of
from scaleladder.spec import SpecError

_log = get_logger(__name__)

SHUFFLE_BUFFER = 256
SHUFFLE_INITIAL = 64


def assign_shards(shards: list[ShardEntry], reader: readers.Reader, resample: bool) -> list[ShardEntry]:
    """The shards one reader draws from: split by node (rank), then by worker."""
    if len(shards) >= reader.count:
        by_node = shards[reader.rank::reader.world]
        return by_node[reader.worker::reader.workers]  # >= 1 each, since len >= world * workers
    if resample:
        return list(shards)
    raise DataError(_too_few(len(shards), reader.world, reader.workers))


def _too_few(n: int, world: int, workers: int) -> str:
    return (
        f"{n} shard(s) cannot give each of world {world} x {workers} worker(s) = {world * workers} readers its own; "
        "re-shard with a smaller --per-shard, use fewer workers, or allow resampling"
    )


class ShardStream(IterableDataset[dict[str, str]]):
    """An endless stream of ``{"url": path}`` for the calling reader."""

    def __init__(self, manifest: Manifest, rank: int, world: int, seed: int, resample: bool) -> None:
        super().__init__()
        self.manifest, self.rank, self.world, self.seed, self.resample = manifest, rank, world, seed, resample

    def __iter__(self) -> Iterator[dict[str, str]]:
        reader = readers.current_reader(self.rank, self.world)
        own = assign_shards(self.manifest.shards, reader, self.resample)
        rng = reader.rng(self.seed, readers.SHARD_ORDER)
        while True:
            # resampled: draw with replacement; otherwise: each own shard once per pass, shuffled.
            order = rng.integers(0, len(own), len(own)) if self.resample else rng.permutation(len(own))
            for i in order:
                yield {"url": str(own[int(i)].path)}


class _SeededShuffle:
    """webdataset's sample shuffle buffer, with a per-reader seeded generator (built in the worker)."""

    def __init__(self, seed: int, rank: int, world: int, bufsize: int) -> None:
        self.seed, self.rank, self.world, self.bufsize = seed, rank, world, bufsize

    def __call__(self, src: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        reader = readers.current_reader(self.rank, self.world)
        rng = random.Random(int(reader.rng(self.seed, readers.SHUFFLE).integers(2**63)))
        shuffled: Iterator[dict[str, Any]] = wds.shuffle(self.bufsize, min(SHUFFLE_INITIAL, self.bufsize), rng=rng)(src)
        return shuffled


def _shard_read_error(exn: Exception) -> bool:
    """webdataset handler: turn tar-level failures into a one-line DataError naming the shard.

    webdataset calls handlers twice for one failure (from the member iterator, then
    from the shard expander, which appends (stream, url) to ``exn.args``); the
    second call knows the url.
    """
    url = exn.args[-1] if len(exn.args) >= 3 and isinstance(exn.args[-1], str) else None
    first = str(exn.args[0]).split(" @ ")[0] if exn.args else type(exn).__name__
    if isinstance(exn, DataError):
        if url is None:
            raise exn
        raise DataError(f"{url}: {first}") from None
    what = f"truncated or corrupt shard ({type(exn).__name__}: {first})"
    raise DataError(f"{url}: {what}" if url else what) from None


class ShardLoader:
    """Iterable of exactly ``steps`` batches; ``len()`` is ``steps``.

    Re-raises data errors from the workers as one line (a DataLoader worker's
    exception comes back with the worker's whole traceback in its message).
    """

    def __init__(self, loader: wds.WebLoader, steps: int, manifest: Manifest, flavor: Flavor,
                 decoder: DeviceDecoder | None = None, transport: str = "float32") -> None:
        self.loader, self.steps, self.manifest, self.flavor = loader, steps, manifest, flavor
        self.inputs = family_of(flavor).inputs  # what the batches hold (models/family.py's Inputs)
        # decode="gpu": the batches hold encoded JPEGs; the rung's feed calls this on the
        # device to make the images (devdecode.py). None: the workers made them.
        self.decoder = decoder
        self.transport = "jpeg" if decoder is not None else transport  # what crosses from the workers
        self.workers = 0
        self.work_s = 0.0  # seconds the transforms took, summed over workers (see samples_per_s)
        self.samples = 0
        self.cpu_s: list[float] = []  # per batch handed out: the workers' CPU seconds for it (host_cpu_s)
        self.extra_attrs: dict[str, Any] = {}  # set by the caller: --workers auto's choice

    def device_transform(self, device: torch.device) -> Any:
        """What the rank runs on each host batch where the copy would be (rung/feed.py): the
        device decoder (``jpeg``), the device-side normalisation (``uint8``), or nothing
        (``float32``: the workers normalised)."""
        if self.decoder is not None:
            return self.decoder
        if not INPUT_KINDS[self.inputs].reads_images:
            return None
        return DeviceNormaliser(self.inputs, device) if self.transport == "uint8" else None

    @property
    def decode_path(self) -> str:
        return "cpu" if self.decoder is None else f"gpu ({self.decoder.device.type} decode)"

    def __len__(self) -> int:
        return self.steps

    def record_attrs(self) -> dict[str, Any]:
        """What a rung record should keep about its data beyond the manifest path.

        ``tokenizer_vocab_size`` (inputs that read text: FLAVA's): the model keeps its published vocabulary
        (so FLOPs and memory match the seeds), and a smaller tokenizer leaves rows of
        the embedding unused; recording it shows that a run trained on fewer ids.
        """
        size = self.manifest.tokenizer_vocab_size
        attrs: dict[str, Any] = {"decode_path": self.decode_path, "loader_workers": self.workers,
                                 "loader_transport": self.transport, **self.extra_attrs}
        if INPUT_KINDS[self.inputs].reads_text and size is not None:
            attrs["tokenizer_vocab_size"] = size
        return attrs

    @property
    def samples_per_s(self) -> float:
        """The loader's own rate: samples over the seconds the transforms took (decode,
        crop, resize, masks, text; summed over the workers, which run in parallel), times
        the readers working at once. What the loader could deliver, whether or not the
        steps waited for it. NaN before the first batch. Tar reading, shuffling and the
        hand-over to the main process are not counted (small next to the transforms);
        with decode="gpu", the device decode is part of the step time instead."""
        if not self.work_s:
            return float("nan")
        return self.samples / self.work_s * max(self.workers, 1)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        n = 0
        try:
            for batch in self.loader:
                n += 1
                work = batch.pop("__work_s", None)
                if work is not None:
                    self.work_s += float(work)
                    self.samples += len(next(iter(batch.values())))
                cpu = batch.pop("__cpu_s", None)
                self.cpu_s.append(float(cpu) if cpu is not None else float("nan"))
                yield batch
        except DataError as e:
            raise DataError(one_line(e)) from None
        if n != self.steps:  # cannot happen with endless streams; a rank hanging DDP is worse than this error
            raise DataError(f"{self.manifest.path}: loader gave {n} batches instead of {self.steps}")


def _check_tokenizer(manifest: Manifest, flavor: Flavor) -> str | None:
    """The shards' tokenizer is there, is the one they were made with, and fits the model's vocabulary."""
    tok = _check_tokenizer_file(manifest)
    return check_vocab(int(tok["vocab_size"]), flavor, where=f"tokenizer {manifest.tokenizer_path}")


def _check_tokenizer_file(manifest: Manifest) -> dict[str, Any]:
    """The manifest's tokenizer entry, its file there and the one the shards were made with."""
    tok: dict[str, Any] = manifest.info.get("tokenizer", {})
    path = manifest.tokenizer_path
    if not path.is_file():
        raise DataError(f"{path}: tokenizer named by {manifest.path} does not exist")
    if tok.get("sha256") and sha256_file(path) != tok["sha256"]:
        raise DataError(f"{path}: sha256 does not match {manifest.path.name}; re-run `scaleladder shard`")
    return tok


def _check_text_tokenizer(manifest: Manifest, flavor: Flavor) -> str | None:
    """As :func:`_check_tokenizer`, and the tokenizer's special ids are the model's (a models-file
    text model's config takes the project tokenizer's: data/pair_transforms.check_tokenizer)."""
    _check_tokenizer_file(manifest)
    return check_tokenizer(load_tokenizer(manifest.tokenizer_path).get_vocab(), flavor, f"tokenizer {manifest.tokenizer_path}")


def _check_labels(manifest: Manifest, flavor: Flavor) -> str | None:
    """Every sample has a label (or the family takes synthetic ones), and the model has a class for each."""
    if not manifest.labelled:
        if not family_of(flavor).synthetic_labels:
            raise DataError(f"{manifest.path}: not every sample has a label, and {flavor.name} is a classifier")
        return (f"{manifest.path}: not every sample has a label; {flavor.name} trains on synthetic ones "
                "(label_source 'synthetic' in the record): its throughput holds, its accuracy means nothing")
    classes = manifest.num_classes or 0
    if classes > flavor.num_classes:
        raise SpecError(f"{manifest.path} has labels up to {classes - 1} but {flavor.name} has {flavor.num_classes} classes")
    return None


#: A per-sample transform: a raw WebDataset sample -> the sample's tensors (data/transforms.py).
Transform: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]


def _image_transform(flavor: Flavor, m: Manifest, seed: int, rank: int, world: int, augment: bool, decode: str,
                     transport: str) -> Transform:
    if m.labelled:  # the reference transform; ImageTransform below is it with synthetic labels
        return VitTransform(flavor, seed, rank, world, augment=augment, decode=decode, transport=transport)
    return ImageTransform(flavor, seed, rank, world, labelled=False, augment=augment, decode=decode, transport=transport)


def _text_transform(flavor: Flavor, m: Manifest, seed: int, rank: int, world: int, augment: bool, decode: str,
                    transport: str) -> Transform:
    return TextTransform(flavor, m.tokenizer_path, seed, rank, world, augment=augment, decode=decode, transport=transport)


def _image_text_transform(flavor: Flavor, m: Manifest, seed: int, rank: int, world: int, augment: bool, decode: str,
                          transport: str) -> Transform:
    return ImageTextTransform(flavor, m.tokenizer_path, seed, rank, world, augment=augment, decode=decode,
                              transport=transport)


def _masked_image_text_transform(flavor: Flavor, m: Manifest, seed: int, rank: int, world: int, augment: bool, decode: str,
                                 transport: str) -> Transform:
    return FlavaTransform(flavor, m.tokenizer_path, seed, rank, world, augment=augment, decode=decode, transport=transport)


@dataclass(frozen=True)
class InputKind:
    """How shards feed one kind of inputs (a family's ``inputs``: models/family.py)."""

    #: the per-sample transform, made per loader: (flavor, manifest, seed, rank, world, augment, decode, transport)
    transform: Callable[[Flavor, Manifest, int, int, int, bool, str, str], Transform]
    #: what must hold before the first batch (raises; returns a notice worth printing, if any)
    check: Callable[[Manifest, Flavor], str | None]
    #: the samples hold text: the shards' tokenizer is checked and its size recorded
    reads_text: bool
    #: the samples hold images (the device normalises or decodes them)
    reads_images: bool = True


#: The loader's transform and checks by a family's ``inputs``: ``image`` (an image and its class
#: label: ViT's and a models-file image model's), ``masked-image-text`` (FLAVA's pretraining
#: inputs), ``text`` (a caption's token ids: a causal LM) and ``image-text`` (an image and its
#: caption's ids: a contrastive model), the last two from data/pair_transforms.py.
INPUT_KINDS: dict[str, InputKind] = {
    "image": InputKind(_image_transform, _check_labels, reads_text=False),
    "masked-image-text": InputKind(_masked_image_text_transform, _check_tokenizer, reads_text=True),
    "text": InputKind(_text_transform, _check_text_tokenizer, reads_text=True, reads_images=False),
    "image-text": InputKind(_image_text_transform, _check_text_tokenizer, reads_text=True),
}


def input_kind(flavor: Flavor) -> InputKind:
    """How shards feed ``flavor`` (its family's ``inputs``); a SpecError where they cannot yet."""
    inputs = family_of(flavor).inputs
    kind = INPUT_KINDS.get(inputs)
    if kind is None:
        raise SpecError(f"{flavor.name} trains on {inputs!r} inputs, which shards cannot feed yet "
                        f"(they feed {', '.join(INPUT_KINDS)}); use --data synthetic")
    return kind


def _check_model_fit(manifest: Manifest, flavor: Flavor) -> str | None:
    """Raise unless the data can feed ``flavor``; return a notice worth printing, if any."""
    return input_kind(flavor).check(manifest, flavor)


def _prepare(manifest: str | Path, flavor: Flavor, rank: int, world: int, workers: int, resample: bool,
             hash_shards: bool) -> tuple[Manifest, str | None]:
    """Everything checked before the first batch (its verdict is shared by every rank)."""
    m = read_manifest(manifest)
    notice = _check_model_fit(m, flavor)
    if not resample and len(m.shards) < world * max(workers, 1):
        raise DataError(f"{m.path}: " + _too_few(len(m.shards), world, max(workers, 1)))
    preflight.check_shards(m, rank, world, hash_shards)
    return m, notice


def make_loader(
    manifest: str | Path,
    flavor: Flavor,
    local_batch: int,
    rank: int,
    world: int,
    steps: int,
    workers: int,
    seed: int,
    pin_memory: bool,
    *,
    resample: bool = True,
    verify: bool = True,
    shuffle_buffer: int = SHUFFLE_BUFFER,
    prefetch_factor: int = 2,
    augment: bool = True,
    keys: bool = False,
    decode: str = "cpu",
    decode_device: torch.device | None = None,
    transport: str = "float32",
    worker_cores: tuple[int, ...] = (),
) -> ShardLoader:
    """A loader that yields exactly ``steps`` batches of ``local_batch`` samples on this rank.

    Batches are ``dict[str, Tensor]`` as in docs/design.md ("Batches"). ``manifest`` is
    the manifest file or its shard directory. Raises DataError/SpecError (one line)
    before any worker starts when the data cannot feed ``flavor`` on this world; with
    a process group of this world, on every rank alike (see :mod:`preflight`).

    ``verify``: sha256-check the shards first (sizes are always checked). ``augment=False``:
    the whole image, no flip, no ITM negatives (deterministic content, for checks).
    ``keys=True``: each batch also holds ``"__key__"``, the samples' keys (a list of str).
    ``decode``: "cpu" (decode + image transforms in the workers: the reference) or "gpu"
    (the workers pass encoded JPEGs; ``ShardLoader.decoder`` makes the images on the
    device, see :mod:`devdecode`); "gpu" is refused with one line where there is no GPU.
    ``decode_device`` overrides the decoder's device (tests run the "gpu" path on the CPU).
    ``transport``: what the workers' images are with decode "cpu": "float32" (normalised in
    the worker) or "uint8" (normalised on the device by ``ShardLoader.device_transform``; the
    rung's choice). ``worker_cores``: the cores the workers are bound to (the
    rank's own kept free: :mod:`cores`); empty: where the OS puts them.
    """
    if not isinstance(workers, int):  # "auto" is resolved by the caller, which knows the rank's cores (cores.loader_workers)
        raise SpecError(f"workers {workers!r}: this caller takes a count (--workers auto is `scaleladder run`'s)")
    for what, value, low in (("local batch", local_batch, 1), ("steps", steps, 1), ("world", world, 1), ("workers", workers, 0)):
        if value < low:
            raise SpecError(f"{what} must be >= {low}, got {value}")
    if not 0 <= rank < world:
        raise SpecError(f"rank {rank} is outside world {world}")
    if transport not in TRANSPORTS:
        raise SpecError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
    decode_on = check_decode(decode, decode_device)  # before any shard is hashed: a refusal costs nothing
    m, notice = preflight.agreed(lambda: _prepare(manifest, flavor, rank, world, workers, resample, verify), rank, world)
    if notice and rank == 0:
        _log.info(f"scaleladder: note: {notice}")

    transform = _transform(flavor, m, seed, rank, world, augment, decode, transport)
    decoder = DeviceDecoder(family_of(flavor).inputs, flavor.image_size, flavor.codebook_image_size, decode_on) if decode == "gpu" else None
    dataset = wds.DataPipeline(
        ShardStream(m, rank, world, seed, resample),
        wds.tarfile_to_samples(handler=_shard_read_error),
        _SeededShuffle(seed, rank, world, shuffle_buffer),
        wds.map(_Timed(transform)),
        wds.batched(local_batch, collation_fn=functools.partial(_collate_costed, keys=keys), partial=False),
    )
    pin = pin_memory and torch.cuda.is_available()  # pinning without a GPU only warns and costs time
    loader = wds.WebLoader(
        dataset,
        batch_size=None,  # batched in the workers above
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        persistent_workers=False,
        worker_init_fn=functools.partial(cores.bind_worker, tuple(worker_cores)) if worker_cores and workers > 0 else None,
    )
    # with_epoch on the LOADER (not the dataset): with several workers a per-dataset
    # epoch is per worker, and the total would be steps x workers.
    shard_loader = ShardLoader(loader.with_epoch(steps), steps, m, flavor, decoder, transport)
    shard_loader.extra_attrs.update(getattr(transform, "record_attrs", dict)())  # label_source, where synthetic
    shard_loader.workers = workers
    return shard_loader


def _transform(flavor: Flavor, m: Manifest, seed: int, rank: int, world: int, augment: bool, decode: str, transport: str) -> Transform:
    return input_kind(flavor).transform(flavor, m, seed, rank, world, augment, decode, transport)


class _Timed:
    """The transform, timed: each sample carries the seconds it took (``__work_s``, summed
    per batch by ``collate``), for the loader's own rate (``ShardLoader.samples_per_s``)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        t = time.perf_counter()
        out: dict[str, Any] = self.fn(sample)
        out["__work_s"] = time.perf_counter() - t
        return out


_LAST_CPU: dict[int, float] = {}  # per worker process: its CPU time at its previous batch


def _collate_costed(samples: list[dict[str, Any]], keys: bool = False) -> dict[str, Any]:
    """``collate``, plus the batch's host cost ``__cpu_s``: in a DataLoader worker, the process's
    CPU seconds since its previous batch (tar reading, shuffling, decode, transforms,
    collation: all of it); in the main process (workers=0), the transforms' own seconds
    (the process's CPU time there is the training's too)."""
    batch = collate(samples, keys=keys)
    if torch.utils.data.get_worker_info() is None:
        batch["__cpu_s"] = batch.get("__work_s", torch.tensor(float("nan")))
        return batch
    now = time.process_time()  # a forked worker's count starts at zero
    pid = os.getpid()
    batch["__cpu_s"] = torch.tensor(now - _LAST_CPU.get(pid, 0.0), dtype=torch.float64)
    _LAST_CPU[pid] = now
    return batch
