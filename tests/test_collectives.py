"""Closed forms for multi-chip execution: ring all-reduce, optimal contiguous split."""

from __future__ import annotations

import itertools
import random

import pytest

from dabench_ir.lowering.collectives import (
    LinkFigures,
    brute_force_split,
    hierarchical_allreduce_time,
    optimal_contiguous_split,
    ring_allreduce_time,
)


def test_ring_allreduce_closed_form():
    # 1 GB over 4 chips at 100 GB/s with 1 µs hops: 2·3/4 · 1e9/1e11 + 6 µs
    assert ring_allreduce_time(1e9, 4, 100e9, 1e-6) == pytest.approx(0.015 + 6e-6)
    assert ring_allreduce_time(1e9, 1, 100e9, 1e-6) == 0.0
    # the bandwidth term tends to 2·bytes/bandwidth as chips grow
    assert ring_allreduce_time(1e9, 1000, 1e9) == pytest.approx(2 * 999 / 1000)


def test_optimal_split_matches_brute_force():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 9)
        parts = rng.randint(1, 5)
        loads = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) * rng.random() for _ in range(n)]
        starts, worst = optimal_contiguous_split(loads, parts)
        assert worst == pytest.approx(brute_force_split(loads, parts))
        bounds = [*starts, n]
        assert starts[0] == 0 and all(a < b for a, b in itertools.pairwise(bounds))
        assert max(sum(loads[a:b]) for a, b in itertools.pairwise(bounds)) == pytest.approx(worst)


def test_split_is_not_round_robin():
    # round robin of 8 equal-ish layers over 2 stages is fine; a heavy tail is not
    starts, worst = optimal_contiguous_split([1, 1, 1, 1, 1, 1, 6], 2)
    assert starts == [0, 6] and worst == 6


def test_hierarchical_allreduce_inside_one_node_is_a_ring():
    intra, inter = LinkFigures(32e9, 5e-6), LinkFigures(12.5e9, 1e-5)
    assert hierarchical_allreduce_time(1e9, 8, 8, intra, inter) == ring_allreduce_time(1e9, 8, *intra)
    assert hierarchical_allreduce_time(1e9, 1, 8, intra, inter) == 0.0


def test_hierarchical_allreduce_across_nodes_exact():
    # 16 chips = 2 nodes of 8: intra ring of 1 GB over 8, then each device's 1/8 shard over 2 nodes
    intra, inter = LinkFigures(32e9, 5e-6), LinkFigures(12.5e9, 1e-5)
    expected = (2 * 7 / 8 * 1e9 / 32e9 + 14 * 5e-6) + (2 * 1 / 2 * 1.25e8 / 12.5e9 + 2 * 1e-5)
    assert hierarchical_allreduce_time(1e9, 16, 8, intra, inter) == pytest.approx(expected)
    assert expected == pytest.approx(0.0647775)
    # a partly filled last node still counts as a node, and its fewer devices carry larger shards
    # across: 12 = 8 + 4, each of the 4 a quarter of the buffer (it was an eighth, as if the node were full)
    partly = (2 * 7 / 8 * 1e9 / 32e9 + 14 * 5e-6) + (2 * 1 / 2 * 2.5e8 / 12.5e9 + 2 * 1e-5)
    assert hierarchical_allreduce_time(1e9, 12, 8, intra, inter) == pytest.approx(partly)
    lone = (2 * 7 / 8 * 1e9 / 32e9 + 14 * 5e-6) + (2 * 1 / 2 * 1e9 / 12.5e9 + 2 * 1e-5)
    assert hierarchical_allreduce_time(1e9, 9, 8, intra, inter) == pytest.approx(lone)  # the ninth: all of it
    # no inter-node link: one flat ring over the intra-node link
    assert hierarchical_allreduce_time(1e9, 16, 8, intra, None) == ring_allreduce_time(1e9, 16, *intra)
