"""Closed forms for multi-chip execution: collectives, optimal stage splits.

Pure functions of sizes and link figures, so `dabench_ir/scaling.py` and the tests share
one definition of each formula.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

__all__ = [
    "LinkFigures",
    "brute_force_split",
    "hierarchical_allreduce_time",
    "optimal_contiguous_split",
    "p2p_time",
    "ring_allreduce_time",
    "root_allreduce_time",
]


def ring_allreduce_time(nbytes: float, chips: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` over ``chips``: 2(n−1)/n · bytes / bandwidth + 2(n−1) hops.

    Reduce-scatter then all-gather, each n−1 steps moving bytes/n per chip
    (Patarasuk & Yuan, J. Parallel Distrib. Comput. 2009). One chip: free.
    """
    if chips <= 1 or nbytes <= 0:
        return 0.0
    if bandwidth <= 0:
        raise ValueError("link bandwidth must be positive")
    return 2 * (chips - 1) / chips * nbytes / bandwidth + 2 * (chips - 1) * latency


def ring_allreduce_bytes(nbytes: float, chips: int) -> float:
    """Bytes the links carry in an all-reduce of ``nbytes`` over ``chips``, all links together: each
    chip sends 2(n−1)/n of the buffer (`ring_allreduce_time`'s volume), and the hierarchical form
    moves the same volume split between its two levels. What the links' energy is of."""
    return 2.0 * (chips - 1) * nbytes if chips > 1 else 0.0


class LinkFigures(NamedTuple):
    """What a collective reads of a link: its bandwidth and the latency of one transfer. A target's
    `dabench_ir.targets.Link` has the same two fields and is passed as it is."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0


class _Link(Protocol):
    @property
    def bandwidth_bytes_per_s(self) -> float: ...
    @property
    def latency_s(self) -> float: ...


def _nothing_to_reduce(nbytes: float, chips: int, per_node: int) -> bool:
    """Whether an all-reduce over nodes of ``per_node`` devices is free (one chip, or no bytes);
    a node of no device is refused."""
    if chips <= 1 or nbytes <= 0:
        return True
    if per_node < 1:
        raise ValueError("devices per node must be at least 1")
    return False


def hierarchical_allreduce_time(nbytes: float, chips: int, per_node: int, intra: _Link, inter: _Link | None) -> float:
    """All-reduce of ``nbytes`` over ``chips`` grouped ``per_node`` to a node.

    ``intra``/``inter``: the link inside a node and each device's share of the network between
    nodes (`LinkFigures`, or a target's `Link`). Within one node: a ring over ``intra``. Across
    nodes (k = per_node devices each, n nodes): reduce-scatter inside each node, an
    all-reduce of each device's 1/k shard across the n nodes (k rings at once, one per
    shard), then an all-gather inside each node; the two intra-node halves together cost
    one intra-node ring all-reduce (Thakur et al., IJHPCA 2005; NCCL's tree/ring hierarchy).
    A last node of fewer devices (``chips`` not a multiple of ``per_node``) splits the buffer
    into fewer, larger shards, each over one device's share of the network: its devices set the
    pace (9 GPUs at 8 a node: the ninth carries the whole buffer across).
    """
    if _nothing_to_reduce(nbytes, chips, per_node):
        return 0.0
    if chips <= per_node or inter is None:
        return _ring(nbytes, chips, intra)
    k = per_node
    nodes = -(-chips // k)
    fewest = chips - (nodes - 1) * k  # devices on the last node: k when every node is full
    return _ring(nbytes, k, intra) + _ring(nbytes / fewest, nodes, inter)


def _ring(nbytes: float, chips: int, link: _Link) -> float:
    return ring_allreduce_time(nbytes, chips, link.bandwidth_bytes_per_s, link.latency_s)


def root_allreduce_time(nbytes: float, chips: int, per_node: int, intra: _Link, inter: _Link | None) -> float:
    """All-reduce of ``nbytes`` over ``chips`` through one root device: every other device sends
    its partial result to the root, which adds them and sends the sum back to each.

    This is how SambaFlow's tensor-parallel compile accumulates a split operator's partial results
    (the root receives each other RDU's result point to point and runs the Add; the split region's
    input goes out from it the same way), so the root's link carries every transfer one after
    another: 2(n−1) transfers of the whole buffer, against 2(n−1)/n of it per device in a ring.
    ``intra``/``inter``: the link inside a node and between nodes (`LinkFigures`, or a target's
    `Link`); the ``per_node`` devices beside the root in its node use ``intra``, the others
    ``inter`` (``intra`` when None). One chip: free.
    """
    if _nothing_to_reduce(nbytes, chips, per_node):
        return 0.0
    local = min(chips, per_node) - 1  # the root's node-mates
    remote = chips - 1 - local
    far = inter or intra
    one_way = local * p2p_time(nbytes, intra.bandwidth_bytes_per_s, intra.latency_s) + remote * p2p_time(
        nbytes, far.bandwidth_bytes_per_s, far.latency_s
    )
    return 2 * one_way  # gather the partial results in, send the sum out


def p2p_time(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """One point-to-point transfer (a pipeline stage boundary)."""
    if nbytes <= 0:
        return 0.0
    if bandwidth <= 0:
        raise ValueError("link bandwidth must be positive")
    return nbytes / bandwidth + latency


def optimal_contiguous_split(loads: Sequence[float], parts: int) -> tuple[list[int], float]:
    """Split ``loads`` into ``parts`` contiguous groups minimising the largest group sum.

    Exact dynamic programme, O(parts · n²). Returns (the index where each group starts,
    the largest group sum). With more parts than loads, the extra parts are empty.
    """
    n = len(loads)
    if parts < 1:
        raise ValueError("parts must be at least 1")
    parts_used = min(parts, n) or 1
    prefix = [0.0, *itertools.accumulate(loads)]
    inf = float("inf")
    # best[k][i]: smallest max-load splitting loads[:i] into k groups; cut[k][i]: start of the last group
    best = [[inf] * (n + 1) for _ in range(parts_used + 1)]
    cut = [[0] * (n + 1) for _ in range(parts_used + 1)]
    best[0][0] = 0.0
    for k in range(1, parts_used + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cand = max(best[k - 1][j], prefix[i] - prefix[j])
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    starts = []
    i = n
    for k in range(parts_used, 0, -1):
        starts.append(cut[k][i])
        i = cut[k][i]
    starts.reverse()
    return starts, (best[parts_used][n] if n else 0.0)


def brute_force_split(loads: Sequence[float], parts: int) -> float:
    """The optimum by enumerating every set of cut points (for tests on small cases)."""
    n = len(loads)
    parts = min(parts, n)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(loads[a:b]) for a, b in itertools.pairwise(bounds)))
    return best
