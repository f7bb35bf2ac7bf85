"""Data-pipeline throughput: is the loader fast enough not to be the bottleneck?

Prints, on this machine:

* loader samples/s (total and per worker) at 224 px, for FLAVA pretraining samples
  (flava-350m: image + codebook image + patch mask + MLM text + ITM) and for ViT
  samples (vit-base: image + label), from shards of 300-900 px JPEGs (web images, as
  real datasets hold: not already at model size, so decode and resize cost what they
  do in a real rung), for each transport across the process boundary: ``float32``
  (normalised in the worker) against ``uint8`` (normalised on the device),
  with the bytes per batch that cross and the workers' CPU seconds per batch;
* shard-writing MB/s of `scaleladder shard --images` (validation: a draft-mode,
  DCT-scaled decode of every JPEG plus its end-of-image check; tar, sha256,
  tokenizer training), next to a plain `tar cf` of the same files as the ceiling;
* the sha256 check every run makes of its shards before the first batch (MB/s,
  one process hashing the whole set, as a one-rank run does).

Not a test: run it by hand and record the numbers in docs/data.md::

    .venv/bin/python benchmarks/bench_data.py [--samples 768] [--batch 32] [--batches 12] [--repeats 3] [--workers 0 1 2]
        [--skip-shard-writing] [--source-sides 300 900]

Each figure is printed as the median and the best of ``--repeats`` timed windows: on
a shared machine the best is the less disturbed estimate of what the code can do.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scaleladder.data import preflight, synthetic
from scaleladder.data.shard_command import main as shard
from scaleladder.data.loader import make_loader
from scaleladder.data.manifest import read_manifest
from scaleladder.flavors import get_flavor

from gpucheck.machine import cpu_model  # benchmarks/ is on sys.path: this runs as a script beside it


def _make_folder(folder: Path, n: int, sides: tuple[int, int], distinct: int | None = None) -> int:
    """n synthetic JPEGs with sidecar captions and labels; their total bytes (synthetic.write_image_folder)."""
    return synthetic.write_image_folder(folder, n, sides, distinct)


def _rates(times: list[float], amount: float) -> str:
    rates = sorted(amount / t for t in times)
    return f"median {statistics.median(rates):7.1f}, best {rates[-1]:7.1f}"


def _sliced(folder: Path, parts: Path, out: Path, jobs: int) -> None:
    """``jobs`` real ``scaleladder shard --slice K/N`` processes at once, then the gather."""
    common = [sys.executable, "-m", "scaleladder.data.shard_command", "--images", str(folder), "--per-shard", "128",
              "--parts", str(parts), "--quiet"]
    procs = [subprocess.Popen([*common, "--slice", f"{k}/{jobs}"]) for k in range(jobs)]
    assert all(p.wait() == 0 for p in procs)
    subprocess.run([*common, "--gather", str(jobs), "--out", str(out)], check=True)


def bench_shard_writing(work: Path, n: int, sides: tuple[int, int], distinct: int, repeats: int, jobs: list[int]) -> None:
    folder = work / "images"
    nbytes = _make_folder(folder, n, sides, distinct)
    mb = nbytes / 1e6
    sizes = sorted(p.stat().st_size for p in folder.glob("*.jpg"))
    shard_times, tar_times = [], []
    job_times: dict[int, list[float]] = {j: [] for j in jobs}
    for r in range(repeats):
        out = work / f"shards{r}"
        t = time.perf_counter()
        assert shard(["--images", str(folder), "--out", str(out), "--per-shard", "128", "--quiet"]) == 0
        shard_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(["tar", "cf", str(work / "plain.tar"), "-C", str(folder), "."], check=True)
        tar_times.append(time.perf_counter() - t)
        shutil.rmtree(out)
        for j in jobs:
            t = time.perf_counter()
            _sliced(folder, work / "parts", work / "sliced", j)
            job_times[j].append(time.perf_counter() - t)
            shutil.rmtree(work / "parts")
            shutil.rmtree(work / "sliced")
    print(f"shard writing: {n} samples (jpg+txt+cls files; {min(distinct, n) if distinct else n} distinct JPEGs of "
          f"{sizes[0] / 1e3:.0f}-{sizes[-1] / 1e3:.0f} KB, median {statistics.median(sizes) / 1e3:.0f} KB), "
          f"{mb:.1f} MB in; {repeats} runs, files in the page cache")
    print(f"  scaleladder shard --images : MB/s {_rates(shard_times, mb)}   samples/s {_rates(shard_times, n)}")
    print(f"  tar cf (ceiling)           : MB/s {_rates(tar_times, mb)}   samples/s {_rates(tar_times, n)}")
    print(f"  shard / tar                : {statistics.median(tar_times) / statistics.median(shard_times):.2f}x (medians), "
          f"{min(tar_times) / min(shard_times):.2f}x (bests)")
    for j in jobs:
        print(f"  {j} --slice jobs + --gather  : MB/s {_rates(job_times[j], mb)}   "
              f"{statistics.median(tar_times) / statistics.median(job_times[j]):.2f}x tar (medians; each job a new process)")


def make_loader_shards(work: Path, n: int, sides: tuple[int, int]) -> Path:
    """The loader's input: ``n`` JPEGs with sides spread over ``sides`` (300..900 px: 20-200 KB,
    as web images are), captions and labels, sharded by ``scaleladder shard --images``."""
    folder, out = work / "loader-images", work / "loader-shards"
    _make_folder(folder, n, sides, distinct=min(n, 128))
    assert shard(["--images", str(folder), "--out", str(out), "--per-shard", "128", "--quiet"]) == 0
    return out


def bench_checksums(shards: Path, repeats: int) -> None:
    m = read_manifest(shards)
    mb = sum(s.filesize for s in m.shards) / 1e6
    times = []
    for _ in range(repeats):  # the files are in the page cache: this is the hashing, not the disk
        t = time.perf_counter()
        preflight.check_shards(m, rank=0, world=1)
        times.append(time.perf_counter() - t)
    print(f"checksums before the first batch: {len(m.shards)} shards, {mb:.1f} MB, one process (page cache)")
    print(f"  sha256 of every shard      : MB/s {_rates(times, mb)}")


def bench_loader(manifest: Path, flavor_name: str, batch: int, batches: int, workers: int, repeats: int, warmup: int = 3,
                 decode: str = "cpu", transport: str = "uint8") -> None:
    """``decode="gpu"``: with a GPU, the workers' part and the device decode (synchronised per
    batch); without one, the workers' part only (tar parsing, JPEG header, masks, text).
    ``transport="uint8"``: the device-side normalisation is not timed here (it runs on the
    rank's device, in the step's shadow); on a GPU it is, as a rung would run it."""
    flavor = get_flavor(flavor_name)
    cuda = torch.cuda.is_available()
    with contextlib.redirect_stderr(io.StringIO()):  # the small-tokenizer note, once per configuration
        loader = make_loader(manifest, flavor, local_batch=batch, rank=0, world=1, steps=warmup + repeats * batches,
                             workers=workers, seed=0, pin_memory=cuda, decode=decode, transport=transport,
                             decode_device=None if cuda or decode == "cpu" else torch.device("cpu"))
    finish = loader.device_transform(torch.device("cuda")) if cuda else None
    sent: list[int] = []

    def step(it: Any) -> None:
        b = next(it)
        sent.append(sum(v.nbytes for v in b.values() if isinstance(v, torch.Tensor)))
        if finish is not None:
            finish(b)
            torch.cuda.synchronize()

    it = iter(loader)
    for _ in range(warmup):  # worker start-up, tokenizer load, nvJPEG init (checksums ran in make_loader)
        step(it)
    times = []
    for _ in range(repeats):  # consecutive windows of one run
        t = time.perf_counter()
        for _ in range(batches):
            step(it)
        times.append(time.perf_counter() - t)
    label = f"{workers} worker(s)" if workers else "in main process"
    if decode == "gpu":
        label += ", GPU decode" if cuda else ", workers' part of GPU decode (no GPU here)"
    per = _rates(times, batches * batch / max(workers, 1))
    cpu = [c for c in loader.cpu_s[warmup:] if c == c]
    print(f"  {flavor_name:11s} {loader.transport:7s} {label:16s}: samples/s {_rates(times, batches * batch)};  per worker {per};  "
          f"{statistics.median(sent) / 1e6:6.2f} MB/batch crossing;  host CPU {statistics.median(cpu) * 1e3 if cpu else float('nan'):6.1f} "
          f"ms/batch = {batch / statistics.median(cpu) if cpu else float('nan'):6.1f} samples per worker CPU-second")
    # The last figure is what data/cores.py's PER_WORKER_SAMPLES_PER_S is read from: CPU time, so
    # it holds on a busy machine where the wall-clock rates above do not (workers >= 1 only).


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=768, help="samples in the benchmark shard set")
    p.add_argument("--source-sides", type=int, nargs=2, default=[300, 900], metavar=("MIN", "MAX"),
                   help="sides of the JPEGs in the loader's shards (px; spread evenly: real images, not at model size)")
    p.add_argument("--skip-shard-writing", action="store_true", help="only the checksum and loader benchmarks")
    p.add_argument("--flavors", nargs="+", default=["flava-350m", "vit-base"])
    p.add_argument("--shard-samples", type=int, default=2048, help="images for the shard-writing benchmark")
    p.add_argument("--shard-distinct", type=int, default=256, help="of which distinct (the rest are copies; 0: all)")
    p.add_argument("--shard-sides", type=int, nargs=2, default=[300, 900], metavar=("MIN", "MAX"),
                   help="image sides for the shard-writing benchmark (px; 300 900 gives 20-200 KB JPEGs)")
    p.add_argument("--slice-jobs", type=int, nargs="*", default=[2], metavar="N",
                   help="also time N parallel `shard --slice` processes + the gather (default: 2)")
    p.add_argument("--skip-loader", action="store_true", help="only the shard-writing benchmark")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=12, help="timed batches per window")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=3, help="timed windows per configuration (median and best are printed)")
    args = p.parse_args()

    print(f"machine: {cpu_model()}, {os.cpu_count()} CPU(s), torch {torch.__version__}, "
          f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    work = Path(tempfile.mkdtemp(prefix="bench_data-"))
    try:
        if not args.skip_shard_writing:
            bench_shard_writing(work, args.shard_samples, tuple(args.shard_sides), args.shard_distinct, args.repeats,
                                args.slice_jobs)
        if args.skip_loader:
            return 0
        lo, hi = args.source_sides
        manifest = make_loader_shards(work, args.samples, (lo, hi))
        bench_checksums(manifest, args.repeats)
        print(f"loader: batch {args.batch}, {args.repeats} x {args.batches} timed batches after 3 warm-up, "
              f"{lo}-{hi} px JPEG shards, 224 px out; float32 vs uint8 across the process boundary")
        for flavor in args.flavors:
            for workers in args.workers:
                for transport in ("float32", "uint8"):
                    bench_loader(manifest, flavor, args.batch, args.batches, workers, args.repeats, transport=transport)
            for workers in args.workers[:2]:
                bench_loader(manifest, flavor, args.batch, args.batches, workers, args.repeats, decode="gpu")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
