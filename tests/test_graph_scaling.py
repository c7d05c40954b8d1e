"""Issue 34: a run's work is linear in its nodes and independent of its micro-batch count, on
every target, counted in Python calls and lines (machine-independent, unlike bench/graph_scaling.py's
times); and the GPU stream's host wait, which repeats one micro-batch in closed form, equals the
kernel-by-kernel loop it replaces."""

from __future__ import annotations

import cProfile
import json
import pstats
import random
import sys
from pathlib import Path

import pytest

from dabench_ir.ir import Node
from dabench_ir.lowering.gpu import KernelGroup, _host_wait
from dabench_ir.passes.training import OPTIMIZER_OP


def _looped(launches, issue_s, micro_batches):
    """The host wait as it was: every kernel of every micro-batch issued in turn."""
    forward, backward, once = [], [], []
    for g in launches:
        if not g.issued:
            continue
        each = g.device_s / (g.runs * g.kernels)
        if g.nodes and g.nodes[0].op_type == OPTIMIZER_OP[1]:
            once += [each] * g.kernels
            continue
        forward.append(each)
        backward += [each] * (g.kernels - 1)
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
    launches = []
    for _ in range(groups):
        kernels, work = rng.choice([1, 3]), rng.random() > 0.1
        device_s = rng.randrange(0, 64) / 64 * m * kernels
        launches.append(KernelGroup([Node("n", "MatMul")], kernels, m, work, device_s=device_s))
    optimizer = [Node("adam", OPTIMIZER_OP[1], domain=OPTIMIZER_OP[0])]
    launches.append(KernelGroup(optimizer, 1, 1, True, device_s=5 / 64))
    return launches


@pytest.mark.parametrize("seed", range(40))
def test_host_wait_in_closed_form_equals_the_loop(seed):
    rng = random.Random(seed)
    m = rng.choice([1, 2, 3, 7, 64])
    launches = _stream(rng, rng.randrange(0, 12), m)
    issue_s = rng.randrange(1, 64) / 64  # host-bound, device-bound and in between
    assert _host_wait(launches, issue_s, m) == _looped(launches, issue_s, m)


def test_host_wait_by_example():
    """Two forward kernels of 1/4 s and 1/2 s, each with one backward (1/4, 1/2, 1/2, 1/4 s in
    turn); the host issues one per 1/2 s. The first micro-batch waits 1/2 s for the first kernel
    and 1/4 s after it; each further one 1/4 s before each of its first two (the 1/2 s kernels keep
    the queue full); 4096 micro-batches run in closed form."""
    launches = [
        KernelGroup([Node("a", "MatMul")], 2, 1, True, device_s=0.5),
        KernelGroup([Node("b", "MatMul")], 2, 1, True, device_s=1.0),
    ]
    assert _host_wait(launches, 0.5, 1) == 0.75
    assert _host_wait(launches, 0.5, 4096) == _looped(launches, 0.5, 4096) == 0.75 + 4095 * 0.5


# -- work per node and per micro-batch, counted (not timed: the count is the same on any machine) ---

TARGETS = ("wse2", "sn30", "bow", "h100", "cpu")


def _calls(graph, target, options=None):
    """Python function calls of one run of ``graph`` on ``target``, its report's JSON included."""
    from dabench_ir.pipeline import profile_graph

    profiler = cProfile.Profile()
    profiler.enable()
    profile_graph(graph.clone(), target, options).to_json(indent=None)
    profiler.disable()
    return pstats.Stats(profiler).total_calls


def _lines(graph, target, options):
    """Python lines run by one run of ``graph`` on ``target``: a loop inside one function counts too."""
    from dabench_ir.pipeline import profile_graph

    count = 0

    def line(frame, event, arg):
        nonlocal count
        count += event == "line"
        return line

    before = sys.gettrace()  # a coverage tool's tracer, put back after
    sys.settrace(lambda frame, event, arg: line)
    try:
        profile_graph(graph.clone(), target, options).to_json(indent=None)
    finally:
        sys.settrace(before)
    return count


def _chain(n: int, width: int):
    """``width`` chains of elementwise nodes, n in all (bench/graph_scaling.py's graphs)."""
    from dabench_ir.frontends.onnx import load_onnx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        from graph_scaling import chain
    finally:
        sys.path.pop(0)
    return load_onnx(chain(n, width))


@pytest.mark.parametrize("width", [1, 8])
def test_calls_per_node_do_not_grow_with_the_graph(width):
    """A chain (and 8 side by side) of 400 and of 1,600 nodes: the larger makes no more calls per
    node on any target (quadratic work would make 4x as many)."""
    small, large = _chain(400, width), _chain(1600, width)
    for target in TARGETS:
        _calls(small, target)  # a target's first use loads its modules and calibration
        per_node = [_calls(g, target) / len(g.nodes) for g in (small, large)]
        assert per_node[1] <= 1.02 * per_node[0], (target, per_node)


def _tiny_gpt2(layers: int, batch: int = 1):
    """A GPT-2 (hidden 64, seq 8) of ``layers`` layers through the package's exporter, stamped like a sweep's."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.sweep import graphs

    params = {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "batch": batch, "positional": "none", "layers": 1}
    return load_onnx(graphs.stamped_proto(graphs.export_base(params), layers), infer_shapes=False)


@pytest.fixture(scope="module")
def tiny_decoder():
    """The tiny GPT-2 at 2 and 8 layers."""
    return {layers: _tiny_gpt2(layers) for layers in (2, 8)}


def test_training_calls_per_node_do_not_grow_with_depth(tiny_decoder):
    for target in TARGETS:
        _calls(tiny_decoder[2], target, {"mode": "train"})
        per_node = [_calls(g, target, {"mode": "train"}) / len(g.nodes) for g in tiny_decoder.values()]
        assert per_node[1] <= 1.02 * per_node[0], (target, per_node)


def test_training_work_does_not_grow_with_the_micro_batches():
    """64 and 4,096 micro-batches of one batch of 4,096 run about the same lines on every target:
    fill, the periods that settle the pipeline, then the rest in closed form (the GPU's host wait
    looped over every kernel of every micro-batch: 64 times the lines). The micro-batches differ
    in size, so value-dependent branches (a bound, a calibration bracket) may differ: within 5 %."""
    graph = _tiny_gpt2(2, batch=4096)
    for target in (t for t in TARGETS if t != "cpu"):  # the host runs a step's batch in one call: refused
        for m in (64, 4096):  # warm: a target's first use, and the per-shape caches
            _calls(graph, target, {"mode": "train", "micro_batches": m})
        few, many = (_lines(graph, target, {"mode": "train", "micro_batches": m}) for m in (64, 4096))
        assert many <= 1.05 * few, (target, few, many)


def test_a_deep_models_weight_list_is_read_past_the_metadata_cap(caplog):
    """A 10,000-layer export names ~120,000 weights (3.6 MB of ``dabench.weights``): read, as long as the
    list is no longer than the quoted names of the graph's inputs and initializers; longer, ignored
    with a warning (a hostile file cannot make the reader parse more than its own names)."""
    from dabench_ir.frontends.checks import MAX_METADATA_CHARS, safe_name_list

    names = [f"layers.{i}.attn.c_attn.weight" for i in range(40_000)]
    text = json.dumps(names)
    assert len(text) > MAX_METADATA_CHARS
    assert safe_name_list(text, "dabench.weights", names) == names
    assert not caplog.records
    assert safe_name_list(text, "dabench.weights", names[:1000]) == []
    assert "too large" in caplog.text
