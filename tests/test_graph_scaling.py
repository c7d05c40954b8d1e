"""Issue 34: a run's time does not grow with its micro-batch count. The GPU stream's host wait
repeats one micro-batch in closed form; it equals the kernel-by-kernel loop it replaces."""

from __future__ import annotations

import random

import pytest

from dabench_ir.ir import Node
from dabench_ir.lowering.gpu import _host_wait
from dabench_ir.passes.training import OPTIMIZER_OP


def _looped(kernels_of, device, issue_s, micro_batches):
    """The host wait as it was: every kernel of every micro-batch issued in turn."""
    forward, backward, once = [], [], []
    for group, kernels, runs, work in kernels_of:
        if not work:
            continue
        each = device[id(group)] / (runs * kernels)
        if group and group[0].op_type == OPTIMIZER_OP[1]:
            once += [each] * kernels
            continue
        forward.append(each)
        backward += [each] * (kernels - 1)
    wait = host = end = 0.0
    for each in (forward + backward[::-1]) * micro_batches + once:
        host += issue_s
        if host > end:
            wait += host - end
            end = host
        end += each
    return wait


def _stream(rng, groups, m):
    """Kernel groups with device times in 1/64 s steps (so every sum is exact in floating point),
    an optimizer group last."""
    kernels_of, device = [], {}
    for _ in range(groups):
        group = [Node("n", "MatMul")]
        kernels, work = rng.choice([1, 3]), rng.random() > 0.1
        kernels_of.append((group, kernels, m, work))
        device[id(group)] = rng.randrange(0, 64) / 64 * m * kernels
    optimizer = [Node("adam", OPTIMIZER_OP[1], domain=OPTIMIZER_OP[0])]
    kernels_of.append((optimizer, 1, 1, True))
    device[id(optimizer)] = 5 / 64
    return kernels_of, device


@pytest.mark.parametrize("seed", range(40))
def test_host_wait_in_closed_form_equals_the_loop(seed):
    rng = random.Random(seed)
    m = rng.choice([1, 2, 3, 7, 64])
    kernels_of, device = _stream(rng, rng.randrange(0, 12), m)
    issue_s = rng.randrange(1, 64) / 64  # host-bound, device-bound and in between
    assert _host_wait(kernels_of, device, issue_s, m) == _looped(kernels_of, device, issue_s, m)


def test_host_wait_by_example():
    """Two forward kernels of 1/4 s and 1/2 s, each with one backward (1/4, 1/2, 1/2, 1/4 s in
    turn); the host issues one per 1/2 s. The first micro-batch waits 1/2 s for the first kernel
    and 1/4 s after it; each further one 1/4 s before each of its first two (the 1/2 s kernels keep
    the queue full); 4096 micro-batches run in closed form."""
    a, b = [Node("a", "MatMul")], [Node("b", "MatMul")]
    kernels_of = [(a, 2, 1, True), (b, 2, 1, True)]
    device = {id(a): 0.5, id(b): 1.0}
    assert _host_wait(kernels_of, device, 0.5, 1) == 0.75
    assert _host_wait(kernels_of, device, 0.5, 4096) == _looped(kernels_of, device, 0.5, 4096) == 0.75 + 4095 * 0.5
