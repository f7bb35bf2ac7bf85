"""Packs: the rungs of one node count run one after another in one batch job.

A pack pays the job's start-up once (``budget.job_startup_s``) and each rung its own
(:attr:`cost.Estimate.rung_s`), so a pack of k rungs saves k - 1 job start-ups, and on a site whose
queue favours few, larger jobs it waits in the queue once. ``site.pack: true`` fills each pack up to
the site's time limit from the time model (first fit in ladder order, per node count) (the pack's ask,
``margin x predicted + slack``, at most the limit: campaign/timelimit.py); ``site.pack: N`` puts N
rungs in each, and a pack of N predicted past the limit is bad input (:class:`PackError`).

Packs are made from EVERY rung of the ladder the site runs in batch jobs, finished or not, on the
time model without calibration, so that a pack's name (``n<nodes>-p<k>``) means the same rungs in
every process that reads the workflow (the job of a pack re-reads it on its node while other packs
finish); a pack runs only those of its rungs that have no result yet. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scaleladder.campaign.timelimit import Limits
from scaleladder.errors import SpecError

__all__ = ["Member", "Pack", "PackError", "pack_rungs", "pack_name"]


class PackError(SpecError):
    """A pack the site's time limit does not allow (bad input: one line, exit 2)."""


@dataclass(frozen=True)
class Member:
    """One rung file of a pack (a repeat is a member of its own)."""

    file: str  # results/rungs/<spec>[.r<k>].h5
    nodes: int
    rung_s: float  # its predicted time inside a pack: its own start-up, probes and steps


@dataclass(frozen=True)
class Pack:
    name: str  # n<nodes>-p<k>
    nodes: int
    members: tuple[Member, ...]

    @property
    def k(self) -> int:
        """Its number among the packs of its node count, from 1."""
        return int(self.name.rsplit("-p", 1)[1])

    def predicted_s(self, job_startup_s: float, files: frozenset[str] | None = None) -> float:
        """The pack's job: its start-up once, then its rungs (only ``files`` of them, if given)."""
        return job_startup_s + sum(m.rung_s for m in self.members if files is None or m.file in files)


def pack_name(nodes: int, k: int) -> str:
    return f"n{nodes}-p{k}"


def pack_rungs(members: Sequence[Member], limits: Limits, job_startup_s: float, size: bool | int) -> list[Pack]:
    """The packs of ``members`` (in their order, per node count in order of first appearance):
    ``size`` True fills each up to the limit, an int puts that many in each."""
    by_nodes: dict[int, list[Member]] = {}
    for m in members:
        by_nodes.setdefault(m.nodes, []).append(m)
    packs: list[Pack] = []
    for nodes, group in by_nodes.items():
        chunks: list[list[Member]] = []
        if size is True:  # first fit, in ladder order: each rung into the first pack it fits
            for m in group:
                room = next((c for c in chunks if limits.fits(job_startup_s + sum(x.rung_s for x in c) + m.rung_s)), None)
                if room is None:
                    chunks.append([m])
                else:
                    room.append(m)
        else:
            chunks = [group[i:i + int(size)] for i in range(0, len(group), int(size))]
        for k, chunk in enumerate(chunks, 1):
            p = Pack(pack_name(nodes, k), nodes, tuple(chunk))
            if not limits.fits(p.predicted_s(job_startup_s)):
                if len(chunk) == 1:  # a rung too long for any job is the time-limit verdict's, not a pack's
                    raise PackError(f"rung {chunk[0].file}: predicted {p.predicted_s(job_startup_s) / 60:.0f} min, "
                                    f"a job asks {limits.rule()}")
                raise PackError(f"pack {p.name}: {len(chunk)} rungs on {nodes} node(s), predicted "
                                f"{p.predicted_s(job_startup_s) / 60:.0f} min; a job asks {limits.rule()}: "
                                f"too large (site.pack {size}; pack fewer rungs, or true to fill each job up to the limit)")
            packs.append(p)
    return packs
