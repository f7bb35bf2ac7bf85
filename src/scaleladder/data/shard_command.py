"""``scaleladder shard``: turn image-text data into WebDataset shards + tokenizer + manifest.

Sources (at most one; none means the embedded synthetic set)::

    scaleladder shard --out data/synthetic                        # 512 synthetic samples, 64 px
    scaleladder shard --out data/pets --images photos/            # sidecar photos/x.txt captions
    scaleladder shard --out data/cc --images imgs/ --captions cc.csv   # path,caption[,label] table
    scaleladder shard --out data/laion --wds 'laion-{00000..00009}.tar'  # re-shard img2dataset output

Exit codes: 0 written, 2 bad input (one line naming the file and key; nothing
written), 1 any other failure or an interrupt (nothing written either).
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from scaleladder.data import sources
from scaleladder.data.data_errors import DataError
from scaleladder.data.tokenizer import DEFAULT_VOCAB_SIZE

if TYPE_CHECKING:
    from scaleladder.data.shard import ShardOptions

SYNTHETIC_SAMPLES = 512
SYNTHETIC_IMAGE_SIZE = 64
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def add_shard_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("source (give none for the embedded synthetic set)")
    src.add_argument("--images", type=Path, metavar="DIR",
                     help="folder of images; captions in sidecar NAME.txt (labels in NAME.cls) unless --captions")
    src.add_argument("--captions", type=Path, metavar="TABLE",
                     help="CSV/TSV/JSONL with path, caption and optional label columns; paths relative to --images"
                          " (default: the table's folder)")
    src.add_argument("--wds", nargs="+", metavar="SHARDS",
                     help="existing WebDataset shards (files, folders, or brace patterns) with jpg/png + txt or json caption")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None, metavar="DIR", help="shard directory to create (default: data/NAME)")
    out.add_argument("--name", default=None, help="shard file prefix: NAME-000000.tar (default: synthetic, or data)")
    out.add_argument("--per-shard", type=int, default=64, metavar="N", help="samples per shard (default 64)")
    out.add_argument("--samples", type=int, default=None, metavar="N",
                     help=f"number of samples (synthetic default {SYNTHETIC_SAMPLES}; sources: at most N good ones, default all)")
    out.add_argument("--image-size", type=int, default=None, metavar="PX",
                     help=f"synthetic: image side (default {SYNTHETIC_IMAGE_SIZE}); sources: shrink so the shorter side is PX"
                          " (default: keep)")
    out.add_argument("--seed", type=int, default=0, help="synthetic data / source shuffling seed (default 0)")
    out.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    tok = parser.add_argument_group("tokenizer")
    tg = tok.add_mutually_exclusive_group()
    tg.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, metavar="N",
                    help=f"train a WordPiece vocabulary of at most N tokens on the captions (default {DEFAULT_VOCAB_SIZE}, fits flava-debug)")
    tg.add_argument("--vocab", type=Path, default=None, metavar="VOCAB_TXT",
                    help="use this BERT vocab.txt instead (e.g. bert-base-uncased for the real FLAVA flavors)")
    par = parser.add_argument_group("parallel sharding (N jobs over slices of the input; the result does not depend on N)")
    par.add_argument("--parts", type=Path, default=None, metavar="DIR",
                     help="where slices are written and gathered from; alone: every slice in this process, then the gather")
    pg = par.add_mutually_exclusive_group()
    pg.add_argument("--slice", default=None, metavar="K/N", help="write slice K of N (0 <= K < N) into --parts, nothing else")
    pg.add_argument("--gather", type=int, default=None, metavar="N", help="make --out from the N slices in --parts")
    parser.add_argument("--skip-bad", action="store_true", help="skip bad samples (counted in the manifest) instead of failing")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors (no progress lines, no summary)")


def _canonical_command(args: argparse.Namespace, options: dict[str, Any]) -> str:
    """The command as a runnable string, rebuilt from the parsed options (independent of how it was invoked)."""
    words = ["scaleladder", "shard"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def _source(args: argparse.Namespace, samples: int | None, image_size: int | None) -> sources.Source:
    if args.wds:
        return sources.wds_source(list(args.wds))
    if args.captions is not None:
        return sources.table_source(args.captions, args.images, args.seed)
    if args.images is not None:
        return sources.folder_source(args.images, args.seed)
    assert samples is not None and image_size is not None
    return sources.synthetic_source(samples, args.seed, image_size)


def _validate(args: argparse.Namespace) -> None:
    if args.wds and (args.images is not None or args.captions is not None):
        raise DataError("give either --wds or --images/--captions, not both")
    for what in ("per_shard", "samples", "image_size", "vocab_size"):
        value = getattr(args, what)
        if value is not None and value < 1:
            raise DataError(f"--{what.replace('_', '-')} must be >= 1, got {value}")
    if (args.slice is not None or args.gather is not None) and args.parts is None:
        raise DataError("--slice and --gather need --parts DIR (where the slices go)")
    if args.gather is not None and args.gather < 1:
        raise DataError(f"--gather must be >= 1, got {args.gather}")
    if args.name is not None and not _NAME_RE.match(args.name):
        raise DataError(f"--name {args.name!r} may only hold letters, digits, '-' and '_' (no dots: WebDataset splits keys at dots)")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    from scaleladder.data.shard import INTERRUPTED, Interrupted

    INTERRUPTED.set()  # in case the exception below is swallowed where it lands
    raise Interrupted(f"signal {signum}")  # not a plain KeyboardInterrupt: shard.Interrupted says why


LOG_PROGRESS_EVERY_S = 30.0


def shard_main(args: argparse.Namespace) -> int:
    # Imported before the SIGTERM handler goes in, as always (webdataset/PIL only when needed);
    # the helpers' own imports of these modules are then lookups.
    from scaleladder.data import slices  # noqa: F401
    from scaleladder.data.shard import INTERRUPTED

    INTERRUPTED.clear()  # a flag left by an earlier run in this process is not this run's

    # SIGTERM (Slurm time limit, Snakemake cancel) must run the cleanup below too;
    # Python's default for SIGTERM is to die without unwinding.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    out = Path(args.out) if args.out is not None else Path(".")  # named by a write error before the real one is known
    try:
        _validate(args)
        request = _request(args)
        out = request.out
        manifest = _write(args, request)
        if manifest is None:  # one slice written, no shard set yet
            return 0
    except DataError as e:
        print(f"scaleladder shard: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("scaleladder shard: interrupted; nothing was written", file=sys.stderr)
        return 1
    except Exception as e:
        if INTERRUPTED.is_set():
            # TRAP: SIGTERM raises inside whatever runs at that moment: mid-import (numpy's C
            # extension, seen in CI) it surfaces as an ImportError, not a KeyboardInterrupt
            print("scaleladder shard: interrupted; nothing was written", file=sys.stderr)
            return 1
        return _shard_error(e, args, out)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not args.quiet:
        _summary(manifest)
    return 0


@dataclass(frozen=True)
class _Request:
    """What a shard command asks for, with the synthetic set's defaults filled in."""

    name: str
    samples: int | None
    image_size: int | None
    out: Path


def _request(args: argparse.Namespace) -> _Request:
    synthetic = not (args.wds or args.images is not None or args.captions is not None)
    name = args.name or ("synthetic" if synthetic else "data")
    samples = args.samples if args.samples is not None else (SYNTHETIC_SAMPLES if synthetic else None)
    image_size = args.image_size if args.image_size is not None else (SYNTHETIC_IMAGE_SIZE if synthetic else None)
    out = args.out if args.out is not None else Path("data") / name
    return _Request(name, samples, image_size, out)


def _options(args: argparse.Namespace, request: _Request) -> dict[str, Any]:
    """The options the manifest records (and its canonical command is made from)."""
    options = {
        "images": str(args.images) if args.images else None,
        "captions": str(args.captions) if args.captions else None,
        "wds": list(args.wds) if args.wds else None,
        "out": str(request.out),
        "name": request.name,
        "per_shard": args.per_shard,
        "samples": request.samples,
        "image_size": request.image_size,
        "seed": args.seed,
        "vocab_size": None if args.vocab else args.vocab_size,
        "vocab": str(args.vocab) if args.vocab else None,
        "skip_bad": args.skip_bad,
    }
    if args.parts is not None:
        # Sliced sharding lays samples out by input index (see slices.py), which
        # differs from the one-process layout once a bad sample is skipped: so it is
        # part of the command that reproduces the set (but N is not: it changes nothing).
        options["parts"] = str(args.parts)
    return options


def _shard_options(args: argparse.Namespace, request: _Request, source: sources.Source | None) -> ShardOptions:
    from scaleladder.data.shard import PROGRESS_EVERY_S, ShardOptions

    return ShardOptions(
        name=request.name,
        per_shard=args.per_shard,
        image_size=request.image_size,
        skip_bad=args.skip_bad,
        vocab_size=args.vocab_size,
        vocab_file=args.vocab,
        progress=not args.quiet,
        # a log file (a workflow job, a Slurm log) keeps every line: a few per minute there
        progress_every=PROGRESS_EVERY_S if sys.stderr.isatty() else LOG_PROGRESS_EVERY_S,
        overwrite=args.overwrite,
        samples=request.samples,
        expected=source.candidates if source else None,
        classes=source.classes if source else None,
    )


def _write(args: argparse.Namespace, request: _Request) -> Path | None:
    """Write what the command asks for: one slice (None), or a shard set (its manifest),
    gathered from slices under ``--parts`` or written in this process."""
    from scaleladder.data import slices
    from scaleladder.data.shard import write_shard_set

    options = _options(args, request)
    if args.slice is not None:
        k, n = slices.parse_slice(args.slice)  # before the source is read: a bad K/N fails at once
    # The gather step reads no source: what it needs (the source's description,
    # the class names) is in the slice records.
    source = _source(args, request.samples, request.image_size) if args.gather is None else None
    opts = _shard_options(args, request, source)
    provenance = {"command": _canonical_command(args, options), "options": options,
                  "source": source.describe if source else None}
    if args.slice is not None:
        assert source is not None
        record = slices.write_slice(source, args.parts, opts, k, n)
        if not args.quiet:
            print(f"wrote slice {k}/{n} to {args.parts} ({record.name})")
        return None
    if args.parts is not None:
        n = args.gather
        if n is None:  # no --slice, no --gather: every slice here (one), then the gather
            n = 1
            assert source is not None
            slices.write_slice(source, args.parts, opts, 0, 1)
        return slices.gather(args.parts, n, request.out, opts, provenance)
    assert source is not None
    return write_shard_set(source.items, request.out, opts, provenance)


def _shard_error(e: Exception, args: argparse.Namespace, out: Path) -> int:
    """One line for a failed shard run, naming the file and cause of a write error."""
    if isinstance(e, OSError):  # disk full, quota, read-only, ulimit -f: one line naming the file, nothing written
        from scaleladder.files import CAUSES, write_error

        if e.errno not in CAUSES:
            print(f"scaleladder shard: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        where = Path(e.filename) if e.filename else Path(args.parts or out)
        if ".partial-" in str(where.parent.name):  # the staging folder, renamed into place only when complete
            where = Path(args.parts or out) / where.name
        print(f"scaleladder shard: error: {write_error(where, e)}; nothing was written", file=sys.stderr)
        return 1
    # anything else: still one line, still nothing written
    print(f"scaleladder shard: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


def _summary(manifest: Path) -> None:
    from scaleladder.data.manifest import read_manifest

    m = read_manifest(manifest)
    skipped = m.info["skipped"]["total"]
    classes = m.info.get("classes")
    print(f"wrote {m.samples} samples in {len(m.shards)} shards to {manifest.parent}"
          + (f" ({skipped} bad samples skipped)" if skipped else "")
          + (f" ({bad_text} caption(s) not UTF-8: bytes replaced with U+FFFD)"
             if (bad_text := m.info["stats"].get("captions_not_utf8")) else "")
          + (f"; labels are class names: {len(classes)} classes, ids in the manifest's 'classes'" if classes else "")
          + f"; manifest {manifest}")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scaleladder shard", description="write WebDataset shards + manifest")
    add_shard_arguments(parser)
    return shard_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
