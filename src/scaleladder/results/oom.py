"""The OOM record's attributes: what a rung that did not fit (or was predicted not to) says.

An ``oom`` record is a result, not a crash: it carries the spec, what failed where, and
the same provenance as an ok record wherever it is known — the parameter count (from the
meta device) and the placement each failing rank wrote into its marker. A rung that
never ran (``predicted-oom``) knows no device or hosts; those attributes are then absent,
never guessed. Pure: the caller (``rung.oom_record.write_oom_record``) gathers what it needs.
Its attributes are defined in results/record.py (kinds ``OOM`` and ``PREDICTED_OOM``).
"""

from __future__ import annotations

from typing import Any

from scaleladder.results.record import OOM, PREDICTED_OOM, Build, Oom, Placement, Record, checked

# Where a rung ran (rung.run.placement): a rank that ran out of memory writes these into
# its marker, so the oom record carries the same provenance as an ok one.
PLACEMENT = Placement.names()


def oom_attrs(run_attrs: dict[str, Any], nodes: int, events: list[dict[str, Any]], world: int, params: int,
              provenance: dict[str, Any], status: str = "oom", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record's attributes. ``events``: one per failing rank (rank, step, error and
    its placement); ``provenance``: the host-level provenance (its ``device_name`` is
    ignored: the ranks' own placement says it). ``extra`` overrides anything."""
    first = min(events, key=lambda e: (e.get("step", -1), e.get("rank", 0))) if events else {}
    placed = {k: e[k] for e in reversed(events) for k in PLACEMENT if k in e}  # the first event's win
    return checked({
        Record.status: status,
        **run_attrs,
        Build.world_size: world,
        Placement.ranks_per_node: world // nodes,  # the launcher put the same number on every node
        Build.params: params,
        Oom.error: first.get("error", ""),
        Oom.oom_step: first.get("step", -1),
        Oom.oom_ranks: [e.get("rank") for e in events],
        **{k: v for k, v in provenance.items() if k != Placement.device_name},
        **placed,
        **(extra or {}),
    }, PREDICTED_OOM if status == PREDICTED_OOM.name else OOM)
