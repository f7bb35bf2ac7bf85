"""Collectives as an alpha-beta model, and which link a group of ranks crosses.

A collective over ``n`` ranks that moves ``S`` bytes (the *whole* tensor: the gathered
output, the reduced input) takes, with a per-message latency ``alpha`` (s) and a per-rank
bandwidth ``beta`` (bytes/s, one direction):

* ring all-gather / reduce-scatter: ``(n-1)·alpha + (n-1)/n · S/beta``
* ring all-reduce (a reduce-scatter then an all-gather): ``2(n-1)·alpha + 2(n-1)/n · S/beta``
* tree all-reduce (NCCL's double binary tree): ``2·log2(n)·alpha + 2·S/beta`` — fewer
  latency terms, no ``(n-1)/n`` bandwidth discount; the model takes whichever is faster,
  as NCCL's tuner does (Thakur, Rabenseifner & Gropp 2005; NCCL's ``tuning.cc``).

The backend changes the algorithm (a links block's ``backend``, default ``nccl``):

* ``gloo`` (torch's ProcessGroupGloo, the CPU backend): all-reduce is gloo's ring only (no
  tree); ``reduce_scatter_tensor`` is NOT a reduce-scatter: ProcessGroupGloo clones the input,
  all-reduces the WHOLE tensor and copies out its chunk (``reduce_scatter_tensor_coalesced``),
  so it costs an all-reduce of ``S`` — twice a ring reduce-scatter's bytes and latencies;
  ``all_gather_into_tensor`` is gloo's ring all-gather into a fresh flat buffer, then a copy
  into the output (``AsyncAllgatherWork``). TRAP: fitting one (alpha, beta) to all-reduce and
  using it for FSDP's gathers and reductions was 9.5x short on a 64 MiB gloo all-gather.

So a link may carry its own figures per collective (``all_gather: {alpha_us, gbps}``, and
``all_reduce``/``reduce_scatter``), each fitted by ``benchmarks/bench_comm.py`` with the
formula above that the backend runs (:func:`terms`); a collective without its own figures uses
the link's ``alpha_us``/``gbps``.

Which link: a group's ranks are contiguous (FSDP's shard group, DDP's world) or strided
(HYBRID's replicate group: one rank per shard group). A group inside one node uses the
node's link — on a node with non-uniform links (Frontier: two GCDs of one MI250X are
joined by four Infinity Fabric links, GCDs of different packages by one or two) a group of
``pair_ranks`` contiguous ranks uses the wide ``intra_pair`` link and a larger one is held
to the slowest hop of its ring. A group spanning nodes is held to ``inter_node``: the
node's NICs are shared by every rank of the node, since the groups tile the world and run the
collective together (HYBRID's replicate groups: one per shard-group rank), so the per-rank
bandwidth is the node's divided by its ranks (TRAP: quoting one NIC's 25 GB/s per GCD would
be 2x optimistic on Frontier, whose 4 NICs serve 8 GCDs).

Torch-free, numbers only: tests/test_steptime.py and tests/test_comm_model.py hold the
arithmetic on hand-computed cases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scaleladder.errors import SpecError

GB = 1e9
LINK_KEYS = ("intra_node", "inter_node")  # required; intra_pair is optional
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class Link:
    """One hop: latency per message (s) and bandwidth per rank, one direction (bytes/s);
    ``own``: (collective, alpha_s, beta_bps) where a collective was fitted on its own;
    ``backend``: which algorithms run on it (the module docstring)."""

    alpha_s: float
    beta_bps: float
    name: str = ""
    own: tuple[tuple[str, float, float], ...] = ()
    backend: str = "nccl"

    def per_rank(self, sharing: int) -> Link:
        """The same link with its bandwidth shared by ``sharing`` ranks (a node's NICs)."""
        k = max(sharing, 1)
        return replace(self, beta_bps=self.beta_bps / k, own=tuple((c, a, b / k) for c, a, b in self.own))

    def figures(self, collective: str) -> tuple[float, float]:
        """(alpha_s, beta_bps) for ``collective``: its own fit, else the link's."""
        for c, a, b in self.own:
            if c == collective:
                return a, b
        return self.alpha_s, self.beta_bps


@dataclass(frozen=True)
class Links:
    """A site's links (profile ``links:``): inside a node, between nodes, and an optional wider
    link inside a package of ``pair_ranks`` ranks (Frontier's MI250X: 2 GCDs).

    ``inter_node.beta_bps`` is the NODE's injection bandwidth (all its NICs), shared by the
    ranks of a group on that node."""

    intra_node: Link
    inter_node: Link
    intra_pair: Link | None = None
    pair_ranks: int = 2

    def for_group(self, size: int, stride: int, ranks_per_node: int) -> Link:
        """The link a ring over ``size`` ranks, ``stride`` apart, is held to."""
        span = (size - 1) * stride + 1  # ranks from the group's first to its last
        if span <= ranks_per_node:
            if self.intra_pair is not None and stride == 1 and size <= self.pair_ranks:
                return self.intra_pair
            return self.intra_node
        # Every rank of the node is in one such group and they all run the collective at the
        # same time (the world's ring; HYBRID's ``stride`` replicate groups side by side), so the
        # node's NICs are shared by all its ranks, not only this group's. TRAP: sharing them
        # among the group's own ranks on the node (1 for a replicate group) made HYBRID's
        # replicate all-reduce up to ranks_per_node x optimistic across nodes.
        return self.inter_node.per_rank(ranks_per_node)


def _figures(raw: Any, where: str) -> tuple[float, float]:
    if not isinstance(raw, Mapping) or "alpha_us" not in raw or "gbps" not in raw:
        raise SpecError(f"{where}: needs alpha_us (latency, microseconds) and gbps (GB/s per direction)")
    alpha, gbps = float(raw["alpha_us"]), float(raw["gbps"])
    if not (alpha >= 0 and gbps > 0 and math.isfinite(alpha) and math.isfinite(gbps)):
        raise SpecError(f"{where}: alpha_us must be >= 0 and gbps > 0, got {alpha}, {gbps}")
    return alpha * 1e-6, gbps * GB


def _link(raw: Any, where: str, backend: str = "nccl") -> Link:
    alpha, beta = _figures(raw, where)
    own = tuple((c, *_figures(raw[c], f"{where}.{c}")) for c in COLLECTIVES if c in raw)
    return Link(alpha, beta, where, own, backend)


def links_from_profile(raw: Any, where: str = "links") -> tuple[Links | None, str]:
    """A profile's links block -> (Links, '') or (None, the one line naming the missing key)."""
    if not raw:
        return None, f"no {where} ({where}.intra_node, {where}.inter_node)"
    for key in LINK_KEYS:
        if key not in raw:
            return None, f"no {where}.{key}"
    backend = str(raw.get("backend", "nccl"))
    if backend not in BACKENDS:
        raise SpecError(f"{where}.backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    pair = raw.get("intra_pair")
    return Links(_link(raw["intra_node"], f"{where}.intra_node", backend),
                 _link(raw["inter_node"], f"{where}.inter_node", backend),
                 None if pair is None else _link(pair, f"{where}.intra_pair", backend), int(raw.get("pair_ranks", 2))), ""


# -- one collective ------------------------------------------------------------------------


def terms(collective: str, n: int, backend: str = "nccl") -> tuple[float, float]:
    """(latency terms, bandwidth factor): the collective's ring time is
    ``k_alpha·alpha + k_beta·S/beta`` (S: the whole tensor's bytes) as ``backend`` runs it.
    One definition for the model and for bench_comm's fit."""
    if n <= 1:
        return 0.0, 0.0
    if collective == "all_reduce" or (collective == "reduce_scatter" and backend == "gloo"):
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    raise ValueError(f"no collective {collective!r} ({', '.join(COLLECTIVES)})")


def _ring_s(collective: str, nbytes: float, n: int, link: Link) -> float:
    k_alpha, k_beta = terms(collective, n, link.backend)
    alpha, beta = link.figures(collective)
    return k_alpha * alpha + k_beta * nbytes / beta


def all_gather_s(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather of a tensor of ``nbytes`` (the gathered output) over ``n`` ranks."""
    return _ring_s("all_gather", nbytes, n, link) if n > 1 else 0.0


def reduce_scatter_s(nbytes: float, n: int, link: Link) -> float:
    """Reduce-scatter of ``nbytes`` (the unreduced input): the all-gather's mirror on NCCL; on
    gloo an all-reduce of the whole tensor (the module docstring)."""
    return _ring_s("reduce_scatter", nbytes, n, link) if n > 1 else 0.0


def all_reduce_s(nbytes: float, n: int, link: Link) -> float:
    """All-reduce of ``nbytes``: the faster of ring and tree (NCCL's tuner picks per size); gloo
    runs the ring."""
    if n <= 1:
        return 0.0
    ring = _ring_s("all_reduce", nbytes, n, link)
    if link.backend == "gloo":
        return ring
    alpha, beta = link.figures("all_reduce")
    return min(ring, 2 * math.ceil(math.log2(n)) * alpha + 2 * nbytes / beta)
