"""A rank's start-up as measured phases: what a rung pays before its first step and after its last.

Marks are taken on one clock, ``time.monotonic()``, from the process's own start (read from
``/proc`` on Linux, so the interpreter's start and every import count). Each phase is the time
from the previous mark to its own (docs/metrics.md, "Start-up"):

* ``imports``: process start -> torch, torch.distributed and the model family's modules imported;
* ``group``: -> the process group is ready (``init_process_group`` returns once every rank has
  joined, so rank 0's figure includes waiting for the slowest rank's imports);
* ``build``: -> data source opened, model built, wrapped (AC, FSDP/DDP; compile happens in the
  first step and is ``compile_s``), optimizer made;
* ``first_batch``: -> the first batch is on hand;
* ``teardown``: the last step -> the record's attributes assembled (statistics, provenance).
  The HDF5 write itself cannot time itself and is not in it.

The record carries rank 0's phases and their sum before the first step as ``startup_s``.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scaleladder.models.family import Family

PHASES: tuple[str, ...] = ("imports", "group", "build", "first_batch")


def process_age_s() -> float | None:
    """Seconds since this process started, from the kernel's own record (Linux), else None.

    TRAP: field 22 of /proc/self/stat counts clock ticks since boot; CLOCK_BOOTTIME is the same
    clock (it keeps counting through suspend, as the kernel's start time does)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in (), may hold spaces
        start_ticks = int(fields[19])  # field 22 of the whole line; 20th after "pid (comm)"
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# Taken when this module is first imported (scaleladder.rung.run imports it before torch), so
# that where /proc says nothing, the phases still start before the heavy imports.
_IMPORTED_AT = time.monotonic()


class StartupClock:
    """Marks on one monotonic clock, from the process's start."""

    def __init__(self) -> None:
        age = process_age_s()
        self.start = time.monotonic() - age if age is not None else _IMPORTED_AT
        self.origin = "process start (/proc)" if age is not None else "scaleladder import"
        self.marks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.monotonic()

    def phases(self) -> dict[str, float]:
        """Each phase's seconds, in order; a phase never marked is left out."""
        out: dict[str, float] = {}
        last = self.start
        for name in PHASES:
            if name in self.marks:
                out[name] = self.marks[name] - last
                last = self.marks[name]
        return out

    def attrs(self, teardown_s: float) -> dict[str, float | str]:
        """The record's start-up attributes (results/record.py, section Startup, names them)."""
        phases = self.phases()
        out: dict[str, float | str] = {f"startup_{k}_s": v for k, v in phases.items()}
        out["startup_s"] = sum(phases.values())
        out["teardown_s"] = teardown_s
        out["startup_origin"] = self.origin
        return out


def import_rank_modules(family: Family) -> None:
    """Import what a rank of ``family`` needs, and nothing else: the phase ``imports`` ends
    here. The family's own modules (``Family.rank_modules``: FLAVA's TorchMultimodal modules)
    only for it; never plotting or workflow modules."""
    importlib.import_module("torch")
    importlib.import_module("torch.distributed")
    importlib.import_module("scaleladder.rung.parallelize")
    importlib.import_module("scaleladder.models.build")
    for module in family.rank_modules:
        importlib.import_module(module)
