"""`run_study`: named pipelines on one model, each placed on every target and diffed against the baseline."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.options import ProfileOptions
from dabench_ir.passes import PassManager
from dabench_ir.progress import silent

from .diff import diff_reports
from .functions import function_changes
from .pipelines import Pipeline, get_pipeline, lost_weights
from .provenance import provenance

__all__ = ["STUDY_SCHEMA", "run_study", "study_run"]

logger = logging.getLogger(__name__)

STUDY_SCHEMA = "dabench-ir/study/v1"
BASELINE = "none"


def _place(model: Any, targets: Sequence[str | None], opts: ProfileOptions, say: Callable[[str], None]) -> dict:
    from dabench_ir.pipeline import profile_targets, run_profile

    if targets == [None]:
        return {None: run_profile(model, None, opts, progress=say)}
    return profile_targets(model, list(targets), opts, progress=say)


def _kind(target: str | None) -> str | None:
    if target is None:
        return None
    from dabench_ir.pipeline import resolve_target

    return resolve_target(target).kind


def study_run(before: dict[str, Any], after: dict[str, Any], prov: Any = None) -> dict[str, Any]:
    """One run of a study (or of `dabench-ir diff`): labels, warnings and the diff of two report dicts."""
    from dabench_ir.execute.calibrate import host_powers
    from dabench_ir.report.compare import compare_reports, estimated_warnings

    rows = compare_reports([before, after], powers=host_powers([before, after]), fitting_first=False)  # before, after
    diff = diff_reports(before, after, prov)
    return {
        "pipeline": rows[1]["pipeline"],
        "target": rows[1]["target"],
        "kind": rows[1]["kind"],
        "label": rows[1]["label"],
        "baseline_label": rows[0]["label"],
        "config": {k: rows[1][k] for k in ("opt_level", "wse_mode", "precision", "mode", "batch")},
        "warnings": estimated_warnings(rows) + _basis_warnings(before, after),
        **diff,
    }


def _basis_warnings(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """A line when the two reports' node rows are not of one basis (one chip's share of a multi-chip
    step beside a whole step): their module and node rows' FLOPs and bytes do not compare, the totals do."""
    basis = [(report.get("extra") or {}).get("nodes_basis") or "the whole step" for report in (before, after)]
    if basis[0] == basis[1]:
        return []
    return [
        f"node rows: before {basis[0]}, after {basis[1]}: their FLOPs and bytes are not one basis "
        "(the totals are the whole step's on both sides)"
    ]


def run_study(
    model: str | Path,
    pipelines: Sequence[str | Pipeline],
    targets: Sequence[str],
    opts: ProfileOptions | None = None,
    *,
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    via: str | None = None,
) -> dict[str, Any]:
    """Run each named pipeline on ``model``, place the result on each target, diff it against the
    baseline (the model as it is, placed with ``opts``) and return the study (schema `STUDY_SCHEMA`).

    With ``out_dir`` every optimised model and every report JSON is written there, so any two
    can be compared again with ``dabench-ir diff``.

    ``via="mlir"`` (the default when a pipeline is an MLIR one) runs the MLIR pipelines
    (`Pipeline.mlir`) on the model's linalg module, each diffed against that module as lowered
    (`study.mlir`); ONNX-level pipelines keep the ONNX baseline, and each is set beside each MLIR
    pipeline (``mlir_vs_onnx``).
    """
    from dabench_ir.pipeline import load_graph

    say = progress or silent
    opts = opts or ProfileOptions()
    if not Path(model).is_file():
        raise UserError(f"{model}: no such model file")
    tlist: list[str | None] = list(targets) or [None]
    mlir_pipes, chosen, kinds = _checked_pipelines(pipelines, via, tlist)
    out = Path(out_dir) if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    stem = Path(model).stem

    names: dict[str | None, str] = {}

    def save(report: Any, pipeline: str, target: str | None) -> None:
        report.extra["pipeline"] = pipeline
        # the same model, rewritten: its reports name it as the baseline's do (labels, compare)
        report.model["name"] = names.setdefault(target, report.model.get("name"))
        if out is not None:
            label = Path(target).stem if target else "cost"  # a target file's path: its stem, not its folders
            report.write_json(out / f"{stem}.{pipeline}.{label}.json")

    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []  # pipelines that failed, each with its one-line reason
    compared: list[dict[str, Any]] = []
    per_node: dict[str, dict] = {}
    if mlir_pipes:
        from .mlir import mlir_runs

        placed_mlir, per_node = mlir_runs(str(model), mlir_pipes, tlist, opts, out=out, save=save, say=say)
        runs += [_mlir_row(placed) for placed in placed_mlir]
    if mlir_pipes and not chosen:  # MLIR pipelines only: their baseline is the module as lowered
        return _doc(model, tlist, [p.name for p in mlir_pipes], runs, compared, failed)
    say(f"baseline: {stem} on {', '.join(t or 'no target' for t in tlist)}")
    base = _place(str(model), tlist, opts, say)
    for t, rep in base.items():
        save(rep, BASELINE, t)
    base_graph = next(iter(base.values())).graph
    for i, pipe in enumerate(chosen, 1):
        ts = [t for t in tlist if pipe.applies_to(kinds[t])]
        say(f"pipeline {i}/{len(chosen)}: {pipe.name}")
        try:  # one pipeline failing (an optimiser's own error) is its row; the others still run
            passes = pipe.build(str(out) if out else None)
            source, pipe_opts = str(model), dataclasses.replace(opts, **dict(pipe.options))
            if passes:
                source_graph = load_graph(source)
                source_graph.bindings.update(base_graph.bindings)  # rewritten at the run's dims (`OnnxRewritePass`)
                rewritten = PassManager(passes)(source_graph).graph
                source = str(rewritten.path)
                if base_graph.bindings:  # the dims are the rewritten model's own now
                    pipe_opts = dataclasses.replace(pipe_opts, seq=None, past=None, compiled_seq=None, dims={})
            placed = _place(source, ts, pipe_opts, say)
        except UserError as exc:
            failed.append(
                {"pipeline": pipe.name, "targets": [t for t in ts if t], "reason": " ".join(str(exc).split())}
            )
            continue
        prov = provenance(base_graph, next(iter(placed.values())).graph) if passes else None
        lost = lost_weights(source_graph, rewritten) if passes else []
        changed_functions = function_changes(source_graph, rewritten, prov) if prov is not None else {}
        for t, rep in placed.items():
            if prov is not None:
                rep.extra["provenance"] = prov.to_dict()
            save(rep, pipe.name, t)
            before, after = base[t].to_dict(), rep.to_dict()
            run = study_run(before, after, prov)
            changed = None
            if passes and not pipe.quantises:
                changed = parameters_changed(before, after, lost)
            if changed and opts.mode == "train":  # a parameter turned constant has no gradient, no update
                withhold_speedup(run, changed)
            elif changed:  # an inference step computes the same from a merged or folded tensor
                run["warnings"].append(changed)
            note_function_changes(run, changed_functions)
            runs.append(run)
            if t == tlist[0]:
                from .mlir import agreement

                compared += [agreement(run, name, nodes) for name, nodes in per_node.items()]
    return _doc(model, tlist, [p.name for p in mlir_pipes + chosen], runs, compared, failed)


def _checked_pipelines(
    pipelines: Sequence[str | Pipeline], via: str | None, tlist: list[str | None]
) -> tuple[list[Pipeline], list[Pipeline], dict[str | None, str | None]]:
    """The MLIR pipelines, the ONNX-level ones and each target's kind, refused before any work: an
    unknown name, an MLIR pipeline under ``--via onnx`` (or ``--via mlir`` without one), an MLIR
    pipeline whose needs are missing, an ONNX pipeline no target takes (an empty table)."""
    picked = [p if isinstance(p, Pipeline) else get_pipeline(p) for p in pipelines if p != BASELINE]
    mlir_pipes = [p for p in picked if p.mlir is not None]
    chosen = [p for p in picked if p.mlir is None]
    if via is None:  # an MLIR pipeline runs on linalg: it says how the study costs
        via = "mlir" if mlir_pipes else "onnx"
    if mlir_pipes and via != "mlir":
        raise UserError(f"pipeline {mlir_pipes[0].name} runs MLIR passes on linalg: drop --via {via}")
    if via == "mlir" and not mlir_pipes:
        raise UserError("--via mlir: give an MLIR pipeline (--mlir-pipeline PASSES, or a named one: --list-pipelines)")
    for p in mlir_pipes:
        p.build(None)  # its `needs` checked before any work
    kinds = {t: _kind(t) for t in tlist}
    for pipe in chosen:
        if not any(pipe.applies_to(kinds[t]) for t in tlist):
            have = ", ".join(f"{t} ({kinds[t]})" for t in tlist if t)
            raise UserError(
                f"--pipeline {pipe.name} applies to {', '.join(sorted(pipe.targets))} targets only, "
                f"{f'not {have}' if have else 'and no --target was given'}; add --target "
                f"{min(pipe.targets)} or drop it"
            )
    return mlir_pipes, chosen, kinds


def _mlir_row(placed: Any) -> dict[str, Any]:
    """An MLIR pipeline's study row (`MlirRun`): its diff against the lowered module, its ``mlir``
    record, and no speedup where the instrument lost work (the figures would compare the loss, not
    what the passes changed)."""
    run = {**study_run(placed.before, placed.after, placed.provenance), "mlir": placed.record}
    lost = placed.record["conservation"]["problem"]
    if lost:
        withhold_speedup(run, lost)
    return run


def note_function_changes(run: dict[str, Any], changes: Mapping[str, str]) -> None:
    """Say in the run's warnings, and in each node row's note, where a rewrite changed the function a
    node computes (`functions.function_changes`: a tanh GELU fused into the exact BiasGelu): its time
    and cost change with the function, so the row is no pure fusion gain."""
    for row in run["nodes"]:
        line = changes.get(row["node"] or "")
        if line:
            row["note"] = "; ".join(filter(None, (row.get("note"), line)))
    run["warnings"] += list(changes.values())


_SPEEDUPS = ("speedup", "speedup_total", "speedup_nodes", "speedup_overheads")


def withhold_speedup(run: dict[str, Any], reason: str) -> None:
    """Null the run's speedups and say why in its warnings: its two sides do not compute the same
    thing, so their times compare the instrument's loss, not what the pipeline changed."""
    run["totals"].update(dict.fromkeys(_SPEEDUPS))
    run["warnings"].append(f"no speedup: {reason}")


def parameters_changed(before: dict[str, Any], after: dict[str, Any], lost: Sequence[str] = ()) -> str | None:
    """Why a rewrite's run does not compare, when its parameter count moved (None when it held, or
    a side does not know it). A rewrite that does not quantise keeps every parameter: one lost is a
    weight the rewrite folded or merged that now loads as a constant (no gradient, no optimizer
    step: onnxruntime's folded transposes once read 107,264 -> 1,792 parameters and 1.46x).
    ``lost``: the source weights no parameter of the rewritten model stands for (`lost_weights`)."""
    counts = [report.get("model", {}).get("params") for report in (before, after)]
    if None in counts or counts[0] == counts[1]:
        return None
    named = ", ".join(lost[:3]) + (f" +{len(lost) - 3}" if len(lost) > 3 else "")
    which = f"; {len(lost)} weights no longer parameters ({named}): merged or dropped by the rewrite" if lost else ""
    return (
        f"parameters changed: {counts[0]:,} before, {counts[1]:,} after (a rewrite that does not quantise "
        f"keeps every parameter; a slice of one folded at the run's dims counts only the slice{which})"
    )


def _doc(
    model: Any, tlist: Sequence[str | None], names: list[str], runs: list, compared: list, failed: list
) -> dict[str, Any]:
    doc = {
        "schema": STUDY_SCHEMA,
        "model": str(model),
        "baseline": BASELINE,
        "targets": [t for t in tlist if t],
        "pipelines": names,
        "runs": runs,
        "failed": failed,
    }
    if compared:
        doc["mlir_vs_onnx"] = compared
    return doc
