"""A rung that did not fit: the marker a rank leaves, and the record written from the markers.

An OOM is a result, not a crash. In a one-rank run the rank records it itself; in a multi-rank
run each rank that ran out of memory writes its marker beside the result file and exits
:data:`EXIT_OOM`, and the supervisor (campaign/supervise.py) writes the record from the markers.
The planner's 'predicted-oom' verdict is written the same way. Torch-free at import: the
supervisors import this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleladder.rung.run_config import RunConfig

__all__ = ["EXIT_OOM", "oom_marker", "write_oom_record"]

#: A rank's exit code when it ran out of memory in a multi-rank run (its marker is written).
EXIT_OOM = 3


def oom_marker(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.oom-rank{rank}.json")


def write_oom_record(cfg: RunConfig, events: list[dict[str, Any]], world: int, status: str = "oom",
                     extra: dict[str, Any] | None = None) -> None:
    """A result for a rung that did not fit (attributes: results.oom), written atomically.

    Called by the rank itself in a one-rank run, and by the supervisor (campaign) from
    the markers of a multi-rank one, or for a rung the planner says cannot fit.
    """
    from scaleladder.models.build import meta_parameter_count
    from scaleladder.results.oom import oom_attrs
    from scaleladder.results.store import write_record
    from scaleladder.rung import provenance

    attrs = oom_attrs(cfg.attrs(), cfg.spec.nodes, events, world, meta_parameter_count(cfg.flavor),
                      provenance.collect(""), status, extra)
    write_record(cfg.out, attrs)

