"""GPU (and host CPU) lowering: one kernel per node or fused elementwise chain, roofline timed.

Each kernel takes ``max(flops / peak, bytes / DRAM bandwidth)`` plus a fixed launch
overhead, on one in-order stream. Weights and the peak of live activations must fit in
device memory (HBM; host DRAM for ``cpu``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from dabench_ir.lowering._common import (
    LoweringContext,
    classify_bound,
    kernel_groups,
    peak_live_bytes,
    training_bytes,
    weight_bytes,
)
from dabench_ir.plan import NodePlan, Plan, Schedule, Unit

if TYPE_CHECKING:
    from dabench_ir.ir import Graph
    from dabench_ir.lowering import LoweringOptions
    from dabench_ir.targets import Target

__all__ = ["lower"]

logger = logging.getLogger(__name__)


def lower(graph: Graph, target: Target, options: LoweringOptions) -> Plan:
    ctx = LoweringContext.build(graph, options.precision, options.batch)
    peak = target.peak_flops(ctx.precision)
    mem = target.feed_memory
    bw = mem.bandwidth_bytes_per_s
    ridge = peak / bw
    # a CPU calibration may call its fixed per-op cost per_op_s
    launch = target.overhead("kernel_launch_s", target.overhead("per_op_s"))
    n_units = target.num_units
    grain = target.arch_value("min_grain_flops", 0.0)
    is_cpu = target.kind == "cpu"
    unit = Unit(id="cpu0" if is_cpu else "stream0", kind="cpu" if is_cpu else "gpu_stream")
    # The host CPU has a calibrated model finer than a roofline (per-shape matmul curves,
    # per-class vector throughput); onnxruntime runs one kernel per node, unfused.
    predicted: dict[str, float] = {}
    if is_cpu:
        from dabench_ir.execute.predict import predict_cpu_times

        predicted = predict_cpu_times(graph, target)
    plan = Plan(
        target=target,
        options=options,
        precision=ctx.precision,
        schedule=Schedule.CONCURRENT,
        units=[unit],
        batch=ctx.batch,
        micro_batches=1,
        unattributed=list(ctx.unattributed),
    )
    weighted_alloc = total_t = 0.0
    traffic = 0
    for group in kernel_groups(ctx, options.fuse_elementwise and not is_cpu):
        launched = False
        for node in group:
            cost = ctx.costs[node.name]
            unit.nodes.append(node.name)
            work = ctx.is_work(node)
            overhead = launch if work and not launched else 0.0
            launched = launched or work
            compute_s = cost.flops / peak
            memory_s = cost.bytes / bw
            time_s = max(compute_s, memory_s) + overhead if work else 0.0
            if node.name in predicted:
                time_s = predicted[node.name]
            if grain > 0 and cost.flops > 0:
                alloc = min(1.0, math.ceil(cost.flops / grain) / n_units)
            else:
                alloc = (1.0 / n_units) if work else 0.0
            plan.node_plans[node.name] = NodePlan(
                node=node.name,
                unit=unit.id,
                lane=unit.id,
                per_micro_batch_s=time_s,
                flops=cost.flops,
                bytes=cost.bytes,
                feed_level=mem.level,
                feed_bytes=cost.bytes,
                compute_s=compute_s if work else 0.0,
                memory_s=memory_s if work else 0.0,
                overhead_s=overhead,
                bound=classify_bound(
                    cost.flops, cost.bytes, ridge, work_s=max(compute_s, memory_s), overhead_s=overhead
                ),
                allocation=alloc,
                note="unattributed: zero time" if node.name in ctx.unattributed else "",
            )
            weighted_alloc += alloc * time_s
            total_t += time_s
            traffic += cost.bytes
    unit.allocation = weighted_alloc / total_t if total_t > 0 else 0.0
    unit.resources = {target.unit_name.lower() + "s": float(n_units)}
    resident = weight_bytes(ctx) + peak_live_bytes(ctx, graph.nodes) + training_bytes(ctx)
    plan.memory_bytes[mem.name] = resident
    plan.traffic_bytes[mem.name] = traffic
    if resident > mem.capacity_bytes:
        plan.fail(
            f"weights and live activations need {resident / 1e9:.2f} GB of {mem.name}, "
            f"{target.name} has {mem.capacity_bytes / 1e9:.2f} GB",
            resident,
            mem.capacity_bytes,
        )
    return plan
