"""Progress and diagnostics through stdlib ``logging``, with the rank (and on several nodes the
host) in each line: ``[rank 3 host nid00012] scaleladder run: ...``.

A module takes its logger with :func:`get_logger` (``get_logger(__name__)``); every logger
under ``scaleladder`` writes to stderr, where a Slurm or Snakemake log (``> log 2>&1``) and
a test's ``capsys`` see it. The message itself is written as given: one process alone (no
rank, one node) prints exactly what ``print`` did.

The level: ``SCALELADDER_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``; default
``info``), which a batch script exports to every rank, or ``scaleladder --log-level``, which
:func:`setup` exports in turn to the processes a command starts (a launcher's ranks).

What is a log line and what stays a ``print``: docs/design.md, "Logging".
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import TextIO

from scaleladder.errors import SpecError

ROOT = "scaleladder"
LEVEL_ENV = "SCALELADDER_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def prefix(env: Mapping[str, str] | None = None, host: str | None = None) -> str:
    """``[rank R host H] ``, ``[rank R] ``, ``[host H] `` or nothing, from the environment.

    The rank: torchrun's (and ``scaleladder spawn``'s) RANK of a WORLD_SIZE over 1, else
    srun's SLURM_PROCID of a step of several tasks (the batch script itself, the supervisor,
    is no rank). The host, when the ranks span nodes: WORLD_SIZE > LOCAL_WORLD_SIZE, or a
    Slurm step or job on more than one node.
    """
    env = os.environ if env is None else env
    world = _int(env, "WORLD_SIZE")
    rank: int | None = None
    if world is not None and world > 1:
        rank = _int(env, "RANK")
    elif (_int(env, "SLURM_STEP_NUM_TASKS") or 0) > 1:
        rank = _int(env, "SLURM_PROCID")
    local = _int(env, "LOCAL_WORLD_SIZE")
    nodes = max(_int(env, name) or 1 for name in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
    several = nodes > 1 or (world is not None and local is not None and world > local)
    parts = ([f"rank {rank}"] if rank is not None else []) + ([f"host {host or _short_host()}"] if several else [])
    return f"[{' '.join(parts)}] " if parts else ""


def _short_host() -> str:
    return socket.gethostname().split(".", 1)[0]


class RankFormatter(logging.Formatter):
    """The message as given, after :func:`prefix` (read per line: RANK appears once the
    process group exists, and a test's environment changes between calls)."""

    def format(self, record: logging.LogRecord) -> str:
        return prefix() + super().format(record)


# type-arg: StreamHandler is generic in typeshed, but subscripting it at run time needs a newer
# Python than requires-python's 3.10.
class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each line (a test's capsys, a redirected stream),
    as logging's own last-resort handler does."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def level_from(value: str | None) -> int:
    """``debug``/``info``/``warning``/``error`` (any case) -> logging's level; unset: INFO."""
    if not value:
        return logging.INFO
    name = value.strip().lower()
    if name not in LEVELS:
        raise SpecError(f"{LEVEL_ENV} / --log-level must be one of {', '.join(LEVELS)}, got {value!r}")
    return int(getattr(logging, name.upper()))


def _install() -> logging.Logger:
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, _Stderr) for h in root.handlers):
        handler = _Stderr()
        handler.setFormatter(RankFormatter("%(message)s"))
        root.addHandler(handler)
        root.propagate = False  # one line per message, whatever the root logger has
        try:
            root.setLevel(level_from(os.environ.get(LEVEL_ENV)))
        except SpecError:
            root.setLevel(logging.INFO)  # a bad value is refused by setup(), the CLI's, as one line
    return root


def get_logger(name: str) -> logging.Logger:
    """The logger of one module (``__name__``), writing as this module says even where no
    CLI ran :func:`setup` (a test, Snakemake importing ``workflow.py``)."""
    _install()
    return logging.getLogger(name)


def setup(level: str | None = None) -> None:
    """The CLI's one call: the level from ``--log-level`` (``level``), else from
    ``SCALELADDER_LOG_LEVEL``, else INFO. A level given here is exported, so that the ranks a
    launcher starts log at it too. A bad value is a SpecError naming it (one line, exit 2)."""
    value = level if level is not None else os.environ.get(LEVEL_ENV)
    resolved = level_from(value)
    if level is not None:
        os.environ[LEVEL_ENV] = level.strip().lower()
    _install().setLevel(resolved)
