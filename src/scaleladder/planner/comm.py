"""Collectives as an alpha-beta model, and which link a group of ranks crosses.

A collective over ``n`` ranks that moves ``S`` bytes (the *whole* tensor: the gathered
output, the reduced input) takes, with a per-message latency ``alpha`` (s) and a per-rank
bandwidth ``beta`` (bytes/s, one direction):

* ring all-gather / reduce-scatter: ``(n-1)·alpha + (n-1)/n · S/beta``
* ring all-reduce (a reduce-scatter then an all-gather): ``2(n-1)·alpha + 2(n-1)/n · S/beta``
* tree all-reduce (NCCL's double binary tree): ``2·log2(n)·alpha + 2·S/beta`` — fewer
  latency terms, no ``(n-1)/n`` bandwidth discount; the model takes whichever is faster,
  as NCCL's tuner does (Thakur, Rabenseifner & Gropp 2005; NCCL's ``tuning.cc``).

Which link: a group's ranks are contiguous (FSDP's shard group, DDP's world) or strided
(HYBRID's replicate group: one rank per shard group). A group inside one node uses the
node's link — on a node with non-uniform links (Frontier: two GCDs of one MI250X are
joined by four Infinity Fabric links, GCDs of different packages by one or two) a group of
``pair_ranks`` contiguous ranks uses the wide ``intra_pair`` link and a larger one is held
to the slowest hop of its ring. A group spanning nodes is held to ``inter_node``: the
node's NICs are shared by its ranks in the group, so the per-rank bandwidth is the node's
divided by the group's ranks on that node (TRAP: quoting one NIC's 25 GB/s per GCD would
be 2x optimistic on Frontier, whose 4 NICs serve 8 GCDs).

Torch-free, numbers only: tests/test_steptime.py holds the arithmetic on hand-computed cases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scaleladder.errors import SpecError

GB = 1e9
LINK_KEYS = ("intra_node", "inter_node")  # required; intra_pair is optional


@dataclass(frozen=True)
class Link:
    """One hop: latency per message (s) and bandwidth per rank, one direction (bytes/s)."""

    alpha_s: float
    beta_bps: float
    name: str = ""

    def per_rank(self, sharing: int) -> Link:
        """The same link with its bandwidth shared by ``sharing`` ranks (a node's NICs)."""
        return Link(self.alpha_s, self.beta_bps / max(sharing, 1), self.name)


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
        on_one_node = max(1, min(size, ranks_per_node // max(stride, 1)))
        return self.inter_node.per_rank(on_one_node)


def _link(raw: Any, where: str) -> Link:
    if not isinstance(raw, Mapping) or "alpha_us" not in raw or "gbps" not in raw:
        raise SpecError(f"{where}: needs alpha_us (latency, microseconds) and gbps (GB/s per direction)")
    alpha, gbps = float(raw["alpha_us"]), float(raw["gbps"])
    if not (alpha >= 0 and gbps > 0 and math.isfinite(alpha) and math.isfinite(gbps)):
        raise SpecError(f"{where}: alpha_us must be >= 0 and gbps > 0, got {alpha}, {gbps}")
    return Link(alpha * 1e-6, gbps * GB, where)


def links_from_profile(raw: Any, where: str = "links") -> tuple[Links | None, str]:
    """A profile's links block -> (Links, '') or (None, the one line naming the missing key)."""
    if not raw:
        return None, f"no {where} ({where}.intra_node, {where}.inter_node)"
    for key in LINK_KEYS:
        if key not in raw:
            return None, f"no {where}.{key}"
    pair = raw.get("intra_pair")
    return Links(_link(raw["intra_node"], f"{where}.intra_node"), _link(raw["inter_node"], f"{where}.inter_node"),
                 None if pair is None else _link(pair, f"{where}.intra_pair"), int(raw.get("pair_ranks", 2))), ""


# -- one collective ------------------------------------------------------------------------


def all_gather_s(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather of a tensor of ``nbytes`` (the gathered output) over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) * link.alpha_s + (n - 1) / n * nbytes / link.beta_bps


def reduce_scatter_s(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of ``nbytes`` (the unreduced input): the all-gather's mirror."""
    return all_gather_s(nbytes, n, link)


def all_reduce_s(nbytes: float, n: int, link: Link) -> float:
    """All-reduce of ``nbytes``: the faster of ring and tree (NCCL's tuner picks per size)."""
    if n <= 1:
        return 0.0
    ring = 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.beta_bps
    tree = 2 * math.ceil(math.log2(n)) * link.alpha_s + 2 * nbytes / link.beta_bps
    return min(ring, tree)
