"""MLIR pipelines in a study: the linalg module's ops placed before and after upstream MLIR passes.

The baseline of an MLIR pipeline is the model's linalg-on-tensors module as torch-mlir lowers
it, one graph node per op (`dabench_ir.mlir.unit_graph`); the pipeline's result is the transformed
module, one node per op again (a fused ``linalg.generic`` is one unit of work). Both are placed
on every target; the diff matches their ops through `dabench_ir.mlir.run_mlir_pipeline`'s
provenance, and each run carries the per-pass table and the per-ONNX-node costs (``mlir``).
`agreement` sets an MLIR pipeline beside an ONNX-level one: bytes of the nodes each fused.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dabench_ir.ir import Cost

from .pipelines import Pipeline
from .provenance import Provenance

__all__ = ["MLIR_BASELINE", "MlirRun", "agreement", "mlir_runs"]

logger = logging.getLogger(__name__)

MLIR_BASELINE = "mlir-none"
"""The pipeline name of the MLIR baseline: the lowered linalg module, one node per op."""


def _node_rows(
    base: Any,
    before: Mapping[str, Cost],
    after: Mapping[str, Cost],
    shared: Mapping[str, set[str]],
    ops_before: Mapping[str, int],
    ops_after: Mapping[str, int],
) -> list[dict[str, Any]]:
    rows = []
    for name in [*before, *(n for n in after if n not in before)]:
        b, a = before.get(name, Cost()), after.get(name, Cost())
        node = base.node(name) if base.has_node(name) else None
        rows.append(
            {
                "node": name,
                "op": node.op_type if node else None,
                "flops_before": b.flops,
                "flops_after": a.flops,
                "bytes_before": b.bytes,
                "bytes_after": a.bytes,
                "ops_before": ops_before.get(name, 0),
                "ops_after": ops_after.get(name, 0),
                "shared_with": sorted(shared.get(name, ())),
                "label": "split: shares fused ops with " + ", ".join(sorted(shared[name]))
                if shared.get(name)
                else None,
            }
        )
    return rows


def _ops_per_node(counts: Sequence[Any]) -> dict[str, int]:
    """Work ops (views excluded) per ONNX node their location names."""
    from dabench_ir.mlir import is_view

    out: dict[str, int] = {}
    for c in counts:
        if is_view(c.op_name):
            continue
        for n in c.origin.names or ((c.origin.name,) if c.origin.name else ("unattributed",)):
            out[n] = out.get(n, 0) + 1
    return out


def _provenance(
    names0: Sequence[str | None], names1: Sequence[str | None], counts1: Sequence[Any], record: Any
) -> Provenance:
    """After unit -> baseline units; each baseline unit in one row (the costliest unit that claims it)."""
    owner: dict[str, tuple[int, str]] = {}
    for k, name in enumerate(names1):
        if name is None:
            continue
        for j in record.sources.get(k, ()):
            src = names0[j]
            if src is not None and (src not in owner or counts1[k].cost.bytes > owner[src][0]):
                owner[src] = (counts1[k].cost.bytes, name)
    prov = Provenance()
    for name in names1:
        if name is not None:
            prov.members.setdefault(name, [])
    for src in (n for n in names0 if n is not None):
        if src in owner:
            prov.members[owner[src][1]].append(src)
            prov.method[src] = "names" if owner[src][1] == src else "subgraph"  # the schema's word for dataflow
        else:
            prov.method[src] = "removed"
    return prov


CONSERVATION_TOLERANCE = 0.01
"""The share of the module's work (FLOPs + bytes) that may lose its graph node, and of its FLOPs
that may leave the costed ops, before a pipeline's run is refused a speedup (`conservation`)."""


def conservation(counts0: Sequence[Any], counts1: Sequence[Any]) -> dict[str, Any]:
    """Whether an MLIR pipeline kept what a study compares: the share of the counted work (FLOPs +
    bytes) whose ops still carry a graph node's location, and the FLOPs the counts still see, before
    and after. ``problem`` names what was lost past `CONSERVATION_TOLERANCE` (a pass that drops
    locations, ``strip-debuginfo``, makes every op lose its node; one that lowers to loops moves the
    work out of the ops the counts cost): such a run gets no speedup (`dabench_ir.study.run`)."""
    from dabench_ir.mlir import is_view

    def traced(counts: Sequence[Any]) -> tuple[float, int]:
        ops = [c for c in counts if not is_view(c.op_name)]
        work = sum(c.cost.flops + c.cost.bytes for c in ops)
        kept = sum(c.cost.flops + c.cost.bytes for c in ops if c.origin.name is not None)
        return (kept / work if work else 1.0), sum(c.cost.flops for c in ops)

    (share0, flops0), (share1, flops1) = traced(counts0), traced(counts1)
    problems = []
    if share1 < share0 - CONSERVATION_TOLERANCE:
        problems.append(
            f"provenance lost: {share0:.0%} of the work traced to graph nodes before the passes, {share1:.0%} after"
        )
    if flops1 < flops0 * (1 - CONSERVATION_TOLERANCE):
        problems.append(f"work left the costed ops: {flops0:,} FLOPs before the passes, {flops1:,} after")
    return {
        "traced_before": share0,
        "traced_after": share1,
        "flops_before": flops0,
        "flops_after": flops1,
        "problem": "; ".join(problems) or None,
    }


@dataclasses.dataclass(frozen=True)
class MlirRun:
    """One MLIR pipeline placed on one target: the baseline's report and the pipeline's (as dicts),
    where each transformed op came from, and the run's ``mlir`` record (passes, steps, node rows,
    conservation)."""

    pipeline: Pipeline
    target: str | None
    before: dict[str, Any]
    after: dict[str, Any]
    provenance: Provenance
    record: dict[str, Any]


def mlir_runs(
    model: str,
    pipes: Sequence[Pipeline],
    targets: Sequence[str | None],
    opts: Any,
    *,
    out: Path | None,
    save: Callable[[Any, str, str | None], None],
    say: Callable[[str], None],
) -> tuple[list[MlirRun], dict[str, dict]]:
    """Place the MLIR baseline and each MLIR pipeline on each target.

    Returns one `MlirRun` per pipeline and target, and per pipeline the per-ONNX-node costs before
    and after (for `agreement`)."""
    from dabench_ir.mlir import MLIR_ARTIFACT, count_module, run_mlir_pipeline, split_by_nodes, unit_graph, unit_names
    from dabench_ir.pipeline import load_for_run, profile_graph

    folder = out or Path(".")  # without -o DIR the modules are named there but not written

    def keep(module: Any, name: str) -> Path:
        path = folder / name
        if out is not None:
            path.write_text(module.get_asm(enable_debug_info=True, large_elements_limit=16))
        return path

    stem = Path(model).stem
    runs = []
    per_node: dict[str, dict] = {}
    groups = _by_precision(model, targets, opts)
    for precision, group in groups.items():
        label = f"{stem}.{precision}" if len(groups) > 1 else stem
        say(f"MLIR baseline: {stem} lowered to linalg" + (f" at {precision}" if precision else ""))
        base = load_for_run(model, _at(opts, precision))  # at the run's --batch, --seq and precision
        art = base.meta[MLIR_ARTIFACT]
        counts0 = count_module(art.module, weight_args=art.weight_args)
        names0 = unit_names(counts0)
        path0 = keep(art.module.operation, f"{label}.{MLIR_BASELINE}.mlir")

        def place(module: Any, counts: Sequence[Any], names: Sequence[str | None], path: Path, t: str | None) -> Any:
            units = unit_graph(base, module, counts, names, path=str(path))  # noqa: B023 - used in this iteration
            units.meta[MLIR_ARTIFACT].precision = art.precision  # noqa: B023 - the module's, which the run records
            return profile_graph(units, t, opts, progress=say)

        baseline = {}
        for t in group:
            rep = place(art.module, counts0, names0, path0, t)
            save(rep, MLIR_BASELINE, t)
            baseline[t] = rep.to_dict()
        by_node0, _ = split_by_nodes(counts0, {})
        ops0 = _ops_per_node(counts0)
        for pipe in pipes:
            assert pipe.mlir is not None
            say(f"MLIR pipeline {pipe.name}: {', '.join(pipe.mlir)}")
            module = art.module.operation.clone()
            record, counts1 = run_mlir_pipeline(module, pipe.mlir, weight_args=art.weight_args, counts=None)
            names1 = unit_names(counts1, suffix=f"/{pipe.name}")
            for k in record.kept:  # an op no pass touched keeps its baseline name
                (j,) = record.sources[k]
                names1[k] = names0[j]
            path1 = keep(module, f"{label}.{pipe.name}.mlir")
            prov = _provenance(names0, names1, counts1, record)
            by_node1, shared = split_by_nodes(counts1, by_node0, sources=record.sources, counts_before=counts0)
            rows = _node_rows(base, by_node0, by_node1, shared, ops0, _ops_per_node(counts1))
            per_node.setdefault(pipe.name, {"before": by_node0, "after": by_node1, "shared": shared})
            doc = {
                "passes": list(pipe.mlir),
                "precision": art.precision,
                "module": str(path1) if out is not None else None,
                "before": record.before.to_dict(),
                "steps": record.steps_dict(),
                "nodes": rows,
                "conservation": conservation(counts0, counts1),
            }
            for t in group:
                rep = place(module, counts1, names1, path1, t)
                rep.extra["provenance"] = prov.to_dict()
                save(rep, pipe.name, t)
                runs.append(MlirRun(pipe, t, baseline[t], rep.to_dict(), prov, doc))
    return runs, per_node


def _at(opts: Any, precision: str | None) -> Any:
    """The study's options for loading the MLIR baseline at ``precision`` (through `--via mlir`)."""
    return dataclasses.replace(opts, via="mlir", precision=precision)


def _by_precision(model: str, targets: Sequence[str | None], opts: Any) -> dict[str | None, list[str | None]]:
    """The targets by the precision each runs at, as `dabench_ir.run.resolve` chooses it (the user's,
    else the target's ``[defaults]``): the module is imported once per precision, and each MLIR row
    runs, and records, the precision its target's ONNX rows run at."""
    from dabench_ir.pipeline import load_graph
    from dabench_ir.run import resolve
    from dabench_ir.targets import is_host

    graph = load_graph(model, dims=opts.dims, batch=opts.batch)
    groups: dict[str | None, list[str | None]] = {}
    for t in targets:
        target = None if t is None or is_host(t) else t  # the host's [defaults] hold no precision
        precision = resolve(graph, target, dataclasses.replace(opts, via="mlir")).options.precision
        groups.setdefault(precision, []).append(t)
    return groups


def agreement(onnx_run: Mapping[str, Any], mlir_pipeline: str, nodes: Mapping[str, Any]) -> dict[str, Any]:
    """Where an ONNX-level pipeline fused nodes, the bytes the MLIR pipeline moves for the same nodes.

    One row per node of ``onnx_run`` that replaced two or more source nodes: its bytes before and
    after at ONNX level, the same source nodes' bytes before and after the MLIR pipeline (linalg
    counts, fused ops split as `dabench_ir.mlir.split_by_nodes`), whether MLIR fused them too (an op of
    the transformed module names two of them), and the verdict: ``same bytes`` (within 1 %), or
    which level moves more."""
    rows = []
    for r in onnx_run["nodes"]:
        group = r["replaces"]
        if r["node"] is None or len(group) < 2:
            continue
        b = sum(nodes["before"].get(n, Cost()).bytes for n in group)
        a = sum(nodes["after"].get(n, Cost()).bytes for n in group)
        fused = any(set(nodes["shared"].get(n, ())) & set(group) for n in group)
        onnx_after = r["bytes_after"] or 0
        if abs(a - onnx_after) <= 0.01 * max(a, onnx_after, 1):
            verdict = "same bytes"
        else:
            verdict = "MLIR moves more" if a > onnx_after else "MLIR moves less"
        rows.append(
            {
                "node": r["node"],
                "op": r["op"],
                "replaces": len(group),
                "onnx_bytes_before": r["bytes_before"],
                "onnx_bytes_after": onnx_after,
                "mlir_bytes_before": b,
                "mlir_bytes_after": a,
                "mlir_fused": fused,
                "verdict": verdict,
            }
        )
    summary = {
        v: sum(1 for r in rows if r["verdict"] == v) for v in ("same bytes", "MLIR moves more", "MLIR moves less")
    }
    return {
        "onnx_pipeline": onnx_run["pipeline"],
        "mlir_pipeline": mlir_pipeline,
        "target": onnx_run["target"],
        "summary": summary,
        "rows": rows,
    }
