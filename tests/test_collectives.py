"""Closed forms for multi-chip execution: ring all-reduce, bubble, optimal contiguous split."""

from __future__ import annotations

import itertools
import random

import pytest

from dabench_ir.lowering.collectives import (
    brute_force_split,
    bubble_fraction,
    optimal_contiguous_split,
    ring_allreduce_time,
)


def test_ring_allreduce_closed_form():
    # 1 GB over 4 chips at 100 GB/s with 1 µs hops: 2·3/4 · 1e9/1e11 + 6 µs
    assert ring_allreduce_time(1e9, 4, 100e9, 1e-6) == pytest.approx(0.015 + 6e-6)
    assert ring_allreduce_time(1e9, 1, 100e9, 1e-6) == 0.0
    # the bandwidth term tends to 2·bytes/bandwidth as chips grow
    assert ring_allreduce_time(1e9, 1000, 1e9) == pytest.approx(2 * 999 / 1000)


@pytest.mark.parametrize(("p", "m", "expected"), [(1, 1, 0.0), (4, 1, 0.75), (4, 4, 3 / 7), (8, 32, 7 / 39)])
def test_bubble(p, m, expected):
    assert bubble_fraction(p, m) == pytest.approx(expected)


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
