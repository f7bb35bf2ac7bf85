"""`scaleladder <command>`: the single entry point.

Each subcommand lives in its own module, which provides ``add_arguments(parser)``
and ``main(args) -> int``. Modules are imported lazily so that ``scaleladder models``
does not pay for importing webdataset or matplotlib.

Exit codes: 0 success (an OOM rung recorded as a result is a success), 2 bad
input (argparse's convention), 1 any other failure, 3 a rank ran out of memory
inside a multi-rank run (see campaign/supervise.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from scaleladder import log
from scaleladder.errors import WriteError
from scaleladder.spec import SpecError

# command -> (module, add-arguments function, main function, help)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "models": ("scaleladder.models.table", "add_arguments", "main", "print every flavor with its parameter count"),
    "run": ("scaleladder.rung.run", "add_arguments", "main", "train one rung and record it in HDF5 (per-rank program)"),
    "launch": ("scaleladder.campaign.supervise", "add_launch_arguments", "launch_main", "run a rung under a launcher; record OOM as a result"),
    "spawn": ("scaleladder.rung.spawn", "add_arguments", "main", "start N ranks on this machine (torchrun's variables, no torch in the launcher)"),
    "finalize": ("scaleladder.campaign.supervise", "add_finalize_arguments", "finalize_main", "turn a finished launch's OOM markers into a record"),
    "shard": ("scaleladder.data.shard_command", "add_shard_arguments", "shard_main", "write WebDataset shards + manifest"),
    "plan": ("scaleladder.site.plan", "add_arguments", "main", "predict per-GPU memory and max batch"),
    "maxbatch": ("scaleladder.campaign.maxbatch", "add_arguments", "main", "find the largest local batch that trains"),
    "aggregate": ("scaleladder.results.aggregate", "add_arguments", "main", "merge rung files into one HDF5"),
    "plots": ("scaleladder.figures.plots", "add_arguments", "main", "draw the figures from an aggregated HDF5"),
    "report": ("scaleladder.figures.report", "add_arguments", "main", "write the Markdown/HTML report"),
    "doctor": ("scaleladder.site.doctor", "add_arguments", "main", "preflight a profile: what would make the campaign fail or lie"),
    "rehearse": ("scaleladder.site.doctor", "add_rehearse_arguments", "rehearse_main", "build and wrap every rung on fake tensors at its world size"),
    "budget": ("scaleladder.site.budget", "add_arguments", "main", "the campaign's cost in node-hours, before submission"),
    "pack": ("scaleladder.campaign.pack", "add_arguments", "main", "run a pack's rungs one after another inside its batch job"),
    "export": ("scaleladder.results.export", "add_arguments", "main", "every rung of a ladder as one table: CSV, Parquet or JSON Lines"),
    "mlflow": ("scaleladder.results.trackers.mlflow_runs", "add_arguments", "main", "log every rung of a ladder to MLflow, one run each"),
    "compare": ("scaleladder.results.compare", "add_arguments", "main", "compare two ladders (or one with references): verdicts within noise"),
    "digits": ("scaleladder.data.digits", "add_arguments", "main", "export scikit-learn's handwritten digits as image folders"),
    "converge": ("scaleladder.campaign.converge", "add_arguments", "main", "train a rung to a held-out accuracy; record time-to-train"),
    "converge-plots": ("scaleladder.figures.convergence", "add_arguments", "main", "draw throughput beside time-to-accuracy from convergence records"),
}


#: Commands that take ``--models FILE`` here; the rung's own commands (run, launch, maxbatch,
#: converge) take it as a RunConfig field, which passes it on to the ranks.
MODELS_FLAG = ("models", "plan", "budget")
MODELS_HELP = ("a models file: YAML, a model name -> a timm, transformers or python entry, whose names may be used "
               "beside the built-in flavors (docs/your-model.md)")


class _Parser(argparse.ArgumentParser):
    # argparse prints usage + error over several lines; we want one line naming the culprit.
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand: the first word that is neither a flag nor --log-level's value."""
    return next((a for i, a in enumerate(argv) if not a.startswith("-") and list(argv[i - 1:i]) != ["--log-level"]), None)


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = _Parser(prog="scaleladder", description="Measure distributed-training strategies rung by rung.")
    parser.add_argument("--log-level", choices=log.LEVELS, type=str.lower,
                        help=f"progress and diagnostics shown (default: ${log.LEVEL_ENV}, else info; "
                             "exported to the ranks a launcher starts)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = command_of(argv)  # only import the module of the command actually asked for
    for name, (module, add_fn, _main, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == wanted:
            getattr(importlib.import_module(module), add_fn)(p)
            if name in MODELS_FLAG:
                p.add_argument("--models", metavar="FILE", help=MODELS_HELP)
    return parser, wanted


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and command_of(sys.argv[1:]) == "run":
        _exit_without_teardown(_main(sys.argv[1:]))
    return _main(list(sys.argv[1:] if argv is None else argv))


def _exit_without_teardown(rc: int) -> None:
    """End a rank's process at once: interpreter teardown with torch loaded costs about a second
    per process (docs/performance.md, "Start-up"), paid by every rung while its launcher waits.

    Only for `run` as a program of its own (never when a test calls main() with arguments),
    after the record is written and the process group destroyed (rung.run's finally), with
    stdout/stderr flushed. TRAP: os._exit skips atexit handlers, so a process that still has
    children (DataLoader workers that were not shut down) exits the ordinary way instead,
    where multiprocessing stops them."""
    import multiprocessing

    sys.stdout.flush()
    sys.stderr.flush()
    if not multiprocessing.active_children():
        os._exit(rc)
    sys.exit(rc)


def _main(argv: list[str]) -> int:
    parser, wanted = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module, _add, main_fn, _help = COMMANDS[args.command]
    try:
        log.setup(args.log_level)
        if getattr(args, "models", None):  # its names known before the command parses a spec
            from scaleladder.models.models_file import register_models_file  # torch-free

            register_models_file(args.models)
        return int(getattr(importlib.import_module(module), main_fn)(args) or 0)
    except SpecError as e:
        print(f"scaleladder {args.command}: error: {e}", file=sys.stderr)
        return 2
    except WriteError as e:  # disk full, quota, read-only, ulimit -f: one line naming the file
        print(f"scaleladder {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"scaleladder {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for users; SCALELADDER_DEBUG=1 for the traceback
        if os.environ.get("SCALELADDER_DEBUG"):
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"scaleladder {args.command}: error: {type(e).__name__}: {first} (SCALELADDER_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
